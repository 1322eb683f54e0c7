"""Running the program under the real Pulumi engine (`pulumi preview/up/destroy`).

Config comes through `pulumi.Config` (so `pulumi config set` and `--config` work) and is
validated before any resource is registered: a bad value stops the update with the same
message the offline plan prints.
"""

from __future__ import annotations

import pulumi

from infra import outputs, program
from infra.config import check_experiment_against_environment, from_pulumi, load_stack_config
from infra.errors import UserError


def run() -> None:
    try:
        cfg = from_pulumi()
        env_cfg = None
        if cfg.is_experiment:
            # The environment's stack file decides isolation and which cluster names are taken.
            env_cfg = load_stack_config(cfg.environment)
            check_experiment_against_environment(cfg, env_cfg)
    except UserError as exc:
        # RunError prints the message without a Python traceback.
        raise pulumi.RunError(exc.render()) from None
    outputs.export(program.build(cfg, env_cfg))
