"""`python -m amlhpc.jobs.runtime.staging`: stage the job's inputs on this node (stager.py)."""

import sys

from amlhpc.jobs.runtime.staging.stager import main

if __name__ == "__main__":
    sys.exit(main())
