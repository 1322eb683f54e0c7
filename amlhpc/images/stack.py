"""Which container registry to build into: the stack outputs' `registry.loginServer`.

Sources, first match wins: an explicit `--login-server`; a stack outputs JSON file
(`--outputs FILE`, the document of docs/contracts.md section 2, e.g. saved from
`pulumi stack output --json`); the deployed stack itself (`pulumi stack output --json
--stack S`). The last two go through the jobs side's loader (amlhpc.jobs.plan.outputs), so the images
and the jobs read, validate and report on the outputs document the same way - including
refusing outputs that belong to another stack. Bad input raises `UserError`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from amlhpc.core.errors import Problem, UserError
from amlhpc.images.commands import Runner

_HOST = re.compile(r"^[a-z0-9][a-z0-9-]*(\.[a-z0-9-]+)+$")


def registry_name(login_server: str) -> str:
    """ACR's resource name from its login server (myacr.azurecr.io -> myacr)."""
    return login_server.split(".", 1)[0]


def check_login_server(value: str, reference: str, path: str) -> str:
    server = value.strip().lower()
    if not _HOST.match(server):
        raise UserError([Problem(reference, path, f"{value!r} is not a registry host name",
                                 "give the login server only, e.g. myacr.azurecr.io (no https://, no path)")],
                        "cannot tell which registry to build into")
    return server


def _subprocess_style(runner: Runner):
    """amlhpc.jobs.plan.outputs calls its runner like subprocess.run; adapt our Runner to that."""

    def run(argv: list[str], capture_output: bool = True, text: bool = True, check: bool = False) -> Any:
        return runner(list(argv), capture=capture_output)

    return run


def resolve_login_server(*, stack: str, runner: Runner, login_server: str | None = None,
                         outputs_file: Path | None = None) -> str:
    """The registry host to build into (see the module docstring for precedence)."""
    if login_server:
        return check_login_server(login_server, "--login-server", "")
    from amlhpc.jobs.plan import (
        outputs as stack_outputs,  # the submit side's loader; lazy: only builds need it
    )

    loaded = stack_outputs.load(stack, outputs_file=outputs_file, runner=_subprocess_style(runner))
    return check_login_server(loaded.outputs.registry.login_server, loaded.reference, "registry.loginServer")
