"""`python -m jobs.runtime.checkpoint`: see jobs/runtime/checkpoint/cli.py."""

import sys

from jobs.runtime.checkpoint.cli import main

sys.exit(main())
