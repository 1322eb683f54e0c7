"""Entry point Pulumi runs for `--policy-pack amlhpc/infra/policy/pack`: serve the aml-hpc rules.

The analyzer starts this file with the pack directory as the working directory; the rules
live in the repository's `amlhpc.infra.policy` package, so the repository root goes on sys.path.
Everything else is in amlhpc/infra/policy/pack_adapter.py (importable, and tested).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from amlhpc.infra.policy.pack_adapter import PACK_NAME, policies  # noqa: E402

if __name__ == "__main__":
    PolicyPack(name=PACK_NAME, policies=policies(), enforcement_level=EnforcementLevel.MANDATORY)
