"""`python -m amlhpc.images`: the training images' build, inspection and checks.

build    build each image missing from the stack's registry (az acr build), print the refs
list     each image's content-hash tag, base and build args (and refs for a registry)
check    pins valid, Dockerfiles and Python locks consistent with them, ssh and key rules, hadolint clean
lock     re-resolve the hashed Python locks from amlhpc/images/pins.toml (uv; needs the package index)
context  stage one image's build context into a folder, for a local `docker build`
smoke    run aml-hpc-smoke inside a built image with the local Docker (GPU machines)

Bad input prints one block naming the file, key, value and fix, and exits 2; `--debug`
shows the traceback. A failed build exits 1 after reporting every image.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from amlhpc.core.cli_help import VersionOption, new_app
from amlhpc.core.errors import Problem, UserError, exit_with
from amlhpc.images import catalog, context, lint, locks
from amlhpc.images.build import DEFAULT_TIMEOUT_S, AzError, AzureCli, build_images, git_commit
from amlhpc.images.commands import CommandNotFound, Runner, SubprocessRunner
from amlhpc.images.pins import load_pins
from amlhpc.images.stack import check_login_server, resolve_login_server

app = new_app(__doc__.split("\n\n")[0])
console = Console(stderr=True)

runner_factory: Callable[[], Runner] | None = None
"""Tests replace this with a factory of fake runners; None means SubprocessRunner."""


def _runner() -> Runner:
    return (runner_factory or SubprocessRunner)()


def _select(names: list[str] | None) -> list[catalog.ImageSpec]:
    if not names:
        return list(catalog.ALL_IMAGES)
    chosen, problems = [], []
    for name in names:
        try:
            chosen.append(catalog.by_name(name))
        except KeyError:
            known = ", ".join(s.name for s in catalog.ALL_IMAGES)
            problems.append(Problem("--image", "", f"unknown image {name!r}", f"choose from: {known}"))
    if problems:
        raise UserError(problems, "unknown image")
    return chosen


@app.callback()
def main(version: VersionOption = False) -> None:
    """aml-hpc training images: build in ACR, inspect, check."""


@app.command()
def build(
    stack: str = typer.Option(..., "--stack", "-s", help="Stack whose registry (outputs registry.loginServer) receives the images."),
    outputs: Annotated[Path | None, typer.Option("--outputs", help="Stack outputs JSON file; wins over asking `pulumi stack output`.")] = None,
    login_server: str | None = typer.Option(None, "--login-server", help="Registry host; wins over --outputs and the stack."),
    image: Annotated[list[str] | None, typer.Option("--image", "-i", help="Only this image (repeatable); default: all.")] = None,
    dry_run: bool = typer.Option(False, "--dry-run", help="Only report which tags are missing; build nothing."),
    platform: str | None = typer.Option(None, "--platform", help="Target platform for az acr build; default: each image's own (linux/amd64, linux/arm64)."),
    timeout: int = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", help="az acr build timeout, seconds."),
    agent_pool: str | None = typer.Option(None, "--agent-pool", help="ACR agent pool (Premium) for builds that outgrow the default agent."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Build each image whose content-hash tag the registry lacks; print every image reference."""
    runner = _runner()
    try:
        specs = _select(image)
        pins = load_pins()
        server = resolve_login_server(stack=stack, runner=runner, login_server=login_server, outputs_file=outputs)
        if platform is not None and not platform.startswith("linux/"):
            raise UserError([Problem("--platform", "", f"{platform!r} is not a Linux platform", "use linux/amd64")], "invalid option")
        az = AzureCli(runner)
        account = az.check_ready()
        console.print(f"registry {server} (subscription {account}); tags from amlhpc/images/pins.toml and the checkout")
        releases = [catalog.release(spec, pins) for spec in specs]
        outcomes = build_images(releases, login_server=server, az=az, commit=git_commit(runner, context.REPO_ROOT),
                                dry_run=dry_run, platform=platform, timeout_s=timeout, agent_pool=agent_pool,
                                echo=console.print)
    except UserError as exc:
        exit_with(exc, debug)
        return
    except AzError as exc:
        if debug:
            raise
        sys.stderr.write(f"az failed: {exc}\n")
        raise typer.Exit(1) from None
    table = Table("image", "reference", "result", title="training images")
    for o in outcomes:
        table.add_row(o.release.spec.name, o.ref, o.action + (f" ({o.detail})" if o.detail else ""))
    console.print(table)
    # The references on stdout, one per line: scripts (and `make images`) can capture them.
    for o in outcomes:
        print(f"{o.release.spec.name}={o.ref}")
    if any(o.action == "failed" for o in outcomes):
        raise typer.Exit(1)


@app.command("list")
def list_images(
    login_server: str | None = typer.Option(None, "--login-server", help="Also print full references for this registry."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Each image's name, repository, content-hash tag, base and build args."""
    try:
        server = check_login_server(login_server, "--login-server", "") if login_server else None
        releases = catalog.releases(specs=catalog.ALL_IMAGES)
    except UserError as exc:
        exit_with(exc, debug)
        return
    rows = [{
        "name": r.spec.name, "repository": r.spec.repository, "tag": r.tag,
        "environment": r.environment_id, "ref": r.ref(server) if server else None,
        "base": r.build_args["BASE_IMAGE"], "buildArgs": dict(r.build_args),
    } for r in releases]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("image", "tag", "base", "ib userspace", "reference" if server else "repository")
    for r, row in zip(releases, rows, strict=True):
        table.add_row(r.spec.name, r.tag, r.build_args["BASE_NAME"], r.build_args.get("IB_USERSPACE", "-"),
                      str(row["ref"] or r.spec.repository))
    Console().print(table)


@app.command()
def check(debug: bool = typer.Option(False, "--debug", help="Show tracebacks.")) -> None:
    """Pins valid, every Dockerfile consistent with them, hadolint clean."""
    try:
        pins = load_pins()
    except UserError as exc:
        exit_with(exc, debug)
        return
    problems: list[Problem] = []
    for spec in catalog.ALL_IMAGES:
        problems += lint.check_dockerfile(spec, pins, context.REPO_ROOT / spec.dockerfile)
    problems += locks.check_all(pins)
    problems += lint.check_common(context.REPO_ROOT)
    dockerfiles = sorted({context.REPO_ROOT / spec.dockerfile for spec in catalog.ALL_IMAGES})
    problems += lint.hadolint(dockerfiles)
    if problems:
        exit_with(UserError(problems, "the image definitions have problems"), debug)
    console.print(f"ok: {len(catalog.ALL_IMAGES)} images ({len(dockerfiles)} Dockerfiles) match amlhpc/images/pins.toml, their "
                  "Python locks are hashed and current, ssh checks host keys, every downloaded key is verified, "
                  "hadolint is clean")


@app.command()
def lock(debug: bool = typer.Option(False, "--debug", help="Show tracebacks.")) -> None:
    """Re-resolve every image's hashed Python lock (amlhpc/images/common/requirements) from the pins."""
    try:
        pins = load_pins()
    except UserError as exc:
        exit_with(exc, debug)
        return
    for path in locks.compile_all(pins):
        console.print(f"wrote {path.relative_to(context.REPO_ROOT)}")


@app.command("context")
def stage_context(
    name: Annotated[str, typer.Argument(help="Image name, e.g. aml-hpc-pytorch.")],
    out: Annotated[Path, typer.Option("--out", help="Empty or new folder to write the build context into.")],
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Stage one image's build context and print the matching `docker build` command."""
    try:
        release = catalog.release(_select([name])[0])
        try:
            context.stage(dict(release.files), out)
        except FileExistsError as exc:
            raise UserError([Problem(str(out), "", "is not empty", "pass a new or empty folder")], "cannot stage the context") from exc
    except UserError as exc:
        exit_with(exc, debug)
        return
    args = " ".join(f"--build-arg {shlex.quote(f'{k}={v}')}" for k, v in release.build_args.items())
    print(f"docker build --platform {release.spec.platform} {args} --build-arg IMAGE_VERSION={release.tag} "
          f"-t {release.spec.repository}:{release.tag} {shlex.quote(str(out))}")


@app.command()
def smoke(
    ref: str = typer.Argument(..., help="Image reference to run, e.g. myacr.azurecr.io/aml-hpc/pytorch:<tag>."),
    expect_ib: bool = typer.Option(False, "--expect-ib", help="Fail when no InfiniBand HCA is visible."),
    json_out: Annotated[Path | None, typer.Option("--results-file", metavar="FILE",
                                                  help="Also write the results as JSON to FILE (on this machine).")] = None,
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Run `aml-hpc-smoke --expect-gpu` in REF with the local Docker and every GPU and HCA."""
    argv = ["docker", "run", "--rm", "--gpus", "all", "--ipc", "host", "--network", "host",
            "--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
    if Path("/dev/infiniband").exists():
        argv += ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK"]
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        argv += ["-v", f"{json_out.parent.resolve()}:/smoke-out"]
    argv += [ref, "aml-hpc-smoke", "--expect-gpu"]
    if expect_ib:
        argv.append("--expect-ib")
    if json_out is not None:
        argv += ["--json", f"/smoke-out/{json_out.name}"]
    try:
        result = _runner()(argv, capture=False)
    except CommandNotFound:
        exit_with(UserError([Problem("docker", "", "Docker is not installed here",
                                 "run the smoke on a GPU machine with Docker, or as an Azure ML job: aml-hpc-smoke --expect-gpu --expect-ib")],
                        "cannot run the smoke test"), debug)
        return
    raise typer.Exit(result.returncode)
