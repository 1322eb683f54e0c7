"""Build the training images in the stack's Azure Container Registry, only when missing.

For each image: its content-hash tag (amlhpc.images.catalog) -> `az acr repository show-tags`;
present -> skip; missing -> stage the build context, verify the staged files hash to the
same tag, `az acr build` with the pins as build args. Returns one outcome per image; a
failure of one image does not undo or stop the others (each tag is immutable once
pushed, so a re-run picks up where this one stopped).

All az calls go through a `Runner` (amlhpc.images.commands) so tests fake them.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from amlhpc.core.errors import Problem, UserError
from amlhpc.images import context
from amlhpc.images.catalog import ImageRelease
from amlhpc.images.commands import CommandNotFound, Runner
from amlhpc.images.stack import registry_name

DEFAULT_TIMEOUT_S = 7200
"""ACR Tasks' default is 3600 s; pulling a ~20 GB NGC base and DeepSpeed can take longer."""


@dataclass(frozen=True)
class Outcome:
    release: ImageRelease
    ref: str
    action: str
    """present (tag already in the registry), built, would-build (dry run) or failed."""
    detail: str = ""


class AzError(Exception):
    """An az command failed for a reason other than bad input (network, permissions)."""


class AzureCli:
    """The az commands the build needs; every call goes through `runner`."""

    def __init__(self, runner: Runner):
        self.runner = runner

    def _run(self, argv: list[str], capture: bool = True):
        try:
            return self.runner(argv, capture=capture)
        except CommandNotFound:
            raise UserError([Problem("az", "", "the Azure CLI (az) is not installed or not on PATH",
                                     "install it: https://learn.microsoft.com/cli/azure/install-azure-cli, then az login")],
                            "cannot build the images") from None

    def check_ready(self) -> str:
        """az is installed and logged in; returns the subscription name (never tokens)."""
        version = self._run(["az", "version", "--output", "json"])
        if not version.ok:
            raise UserError([Problem("az version", "", version.first_error_line(), "reinstall the Azure CLI")],
                            "cannot build the images")
        account = self._run(["az", "account", "show", "--query", "name", "--output", "tsv"])
        if not account.ok:
            raise UserError([Problem("az account show", "", "not logged in to Azure (" + account.first_error_line() + ")",
                                     "run `az login` (and `az account set --subscription <id>` for the stack's subscription)")],
                            "cannot build the images")
        return account.stdout.strip()

    def tags(self, registry: str, repository: str) -> set[str]:
        result = self._run(["az", "acr", "repository", "show-tags", "--name", registry,
                            "--repository", repository, "--output", "json"])
        if not result.ok:
            message = (result.stderr + result.stdout).lower()
            # A repository that was never pushed to has no tags yet: not an error.
            if "not found" in message or "name_unknown" in message or "repository_unknown" in message:
                return set()
            raise AzError(f"az acr repository show-tags --name {registry} --repository {repository}: {result.first_error_line()}")
        try:
            found = json.loads(result.stdout or "[]")
        except json.JSONDecodeError as exc:
            raise AzError(f"az acr repository show-tags printed no JSON: {result.stdout[:200]!r}") from exc
        return {str(tag) for tag in found or []}

    def build(self, *, registry: str, image: str, context_dir: Path, build_args: dict[str, str],
              platform: str, timeout_s: int, agent_pool: str | None) -> int:
        argv = ["az", "acr", "build", "--registry", registry, "--image", image, "--file", "Dockerfile",
                "--platform", platform, "--timeout", str(timeout_s)]
        if agent_pool:
            argv += ["--agent-pool", agent_pool]
        for key, value in build_args.items():
            argv += ["--build-arg", f"{key}={value}"]
        argv.append(str(context_dir))
        # Stream the build log to the terminal: a 20-minute build should not look frozen.
        return self._run(argv, capture=False).returncode


def git_commit(runner: Runner, root: Path) -> str:
    """HEAD's commit for the revision label, with -dirty when tracked files changed."""
    try:
        head = runner(["git", "-C", str(root), "rev-parse", "HEAD"])
        if not head.ok:
            return "unknown"
        dirty = runner(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
    except CommandNotFound:
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.ok and dirty.stdout.strip() else "")


def label_args(release: ImageRelease, commit: str) -> dict[str, str]:
    """Build args that only feed labels (catalog.NOT_HASHED_ARGS)."""
    return {"GIT_COMMIT": commit, "IMAGE_VERSION": release.tag}


def build_images(releases: Iterable[ImageRelease], *, login_server: str, az: AzureCli, commit: str,
                 dry_run: bool = False, platform: str | None = None, timeout_s: int = DEFAULT_TIMEOUT_S,
                 agent_pool: str | None = None, workdir: Path | None = None,
                 echo: Callable[[str], None] = print) -> list[Outcome]:
    """Build every release whose tag the registry lacks; see the module docstring."""
    registry = registry_name(login_server)
    outcomes: list[Outcome] = []
    for release in releases:
        ref = release.ref(login_server)
        if release.tag in az.tags(registry, release.spec.repository):
            echo(f"{release.spec.name}: {ref} already in the registry, skipping")
            outcomes.append(Outcome(release, ref, "present"))
            continue
        if dry_run:
            echo(f"{release.spec.name}: {ref} missing, would build (dry run)")
            outcomes.append(Outcome(release, ref, "would-build"))
            continue
        outcomes.append(_build_one(release, ref, registry, az, commit, platform or release.spec.platform, timeout_s,
                                   agent_pool, workdir, echo))
    return outcomes


def _build_one(release: ImageRelease, ref: str, registry: str, az: AzureCli, commit: str, platform: str,
               timeout_s: int, agent_pool: str | None, workdir: Path | None, echo: Callable[[str], None]) -> Outcome:
    with tempfile.TemporaryDirectory(prefix=f"aml-hpc-{release.spec.folder}-", dir=workdir) as tmp:
        staged = context.stage(dict(release.files), Path(tmp) / "context")
        # What is uploaded must be exactly what the tag promises.
        check = context.content_hash(context.read_staged(staged), dict(release.build_args))
        if check != release.tag:
            return Outcome(release, ref, "failed", f"staged context hashes to {check}, expected {release.tag}")
        echo(f"{release.spec.name}: building {ref} in {registry} ({len(release.files)} files in the context)")
        args = {**release.build_args, **label_args(release, commit)}
        code = az.build(registry=registry, image=f"{release.spec.repository}:{release.tag}", context_dir=staged,
                        build_args=args, platform=platform, timeout_s=timeout_s, agent_pool=agent_pool)
    if code != 0:
        return Outcome(release, ref, "failed", f"az acr build exited {code}; its log is above")
    return Outcome(release, ref, "built")
