"""Running the program under the real Pulumi engine (`pulumi preview/up/destroy`).

Config comes through `pulumi.Config` (so `pulumi config set` and `--config` work) and is
validated before any resource is registered: a bad value stops the update with the same
message the offline plan prints.
"""

from __future__ import annotations

import pulumi

from amlhpc.core.errors import UserError
from amlhpc.infra import outputs, program
from amlhpc.infra.config import from_pulumi


def run() -> None:
    try:
        cfg = from_pulumi()
    except UserError as exc:
        # RunError prints the message without a Python traceback.
        raise pulumi.RunError(exc.render()) from None
    # Experiments read their environment's published outputs (AMLHPC_ENVIRONMENT_OUTPUTS), not its file.
    outputs.export(program.build(cfg))
