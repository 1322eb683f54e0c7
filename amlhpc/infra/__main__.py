"""Entry point for both the Pulumi engine (Pulumi.yaml `main: amlhpc/infra/`) and `python -m amlhpc.infra`.

Under the engine a resource monitor is configured before this file runs: then it is the
Pulumi program. Otherwise it is the offline CLI (amlhpc/infra/cli.py).
"""

import sys
from pathlib import Path

# The engine runs this file by path; make the repository importable as `infra`, `jobs`.
_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from amlhpc.core.interpreter import check  # noqa: E402

check("infra")

from pulumi.runtime import settings  # noqa: E402

if settings.get_monitor() is None:
    from amlhpc.core.cli_help import run as run_cli
    from amlhpc.infra.cli import app

    run_cli(app, "python -m amlhpc.infra")
else:
    from amlhpc.infra.engine import run

    run()
