"""Entry point the Pulumi engine runs for amlhpc/infra/access (`scripts/access-setup.sh up`)."""

import sys
from pathlib import Path

# The engine runs this file by path from amlhpc/infra/access: make the repository importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import pulumi  # noqa: E402

from amlhpc.core.errors import UserError  # noqa: E402
from amlhpc.infra.access.config import from_pulumi  # noqa: E402
from amlhpc.infra.access.program import build  # noqa: E402

try:
    config = from_pulumi()
except UserError as exc:  # the message names the key and the fix, without a traceback
    raise pulumi.RunError(exc.render()) from None
for key, value in build(config).items():
    pulumi.export(key, value)
