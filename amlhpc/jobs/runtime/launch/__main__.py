"""`python -m amlhpc.jobs.runtime.launch`: the in-job launcher (launcher.py)."""

import sys

from amlhpc.jobs.runtime.launch.launcher import main

if __name__ == "__main__":
    sys.exit(main())
