"""`python -m amlhpc.jobs.runtime.checkpoint`: see amlhpc/jobs/runtime/checkpoint/cli.py."""

import sys

from amlhpc.jobs.runtime.checkpoint.cli import main

sys.exit(main())
