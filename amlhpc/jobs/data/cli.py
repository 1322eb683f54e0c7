"""`python -m amlhpc.jobs data ...`: dataset commands (mounted by amlhpc/jobs/cli/main.py as `data`).

    python -m amlhpc.jobs data upload LOCAL_DIR --stack dev --prefix NAME
        [--outputs FILE | --offline] [--connection-string-env VAR] [--container NAME]
        [--workers N] [--level N] [--member-mib N] [--resume K] [--checksum] [--register-asset]
        [--allow-skips] [--cap-mbps N] [--json]
    python -m amlhpc.jobs data versions --stack dev --prefix NAME [target options] [--json]
    python -m amlhpc.jobs data seal --stack dev --prefix NAME [--reseal BLOB ...] [target options] [--json]

Where the data goes:
- Azure (default): the stack's dataset account (`storage.blobEndpoint`) and container
  (`storage.containers.datasets`) from the deployed stack's outputs, or `--outputs FILE`;
  signed in with DefaultAzureCredential (`az login`, a managed identity, CI's OIDC). Your
  identity needs Storage Blob Data Contributor: list it in `aml-hpc:storage.dataContributors`.
- Azurite: `--connection-string-env VAR` names the environment variable holding the
  connection string (the string itself is never printed). The container comes from
  `--container`, else from the outputs when `--outputs`/`--offline` is given, else
  `datasets`; it is created when missing.

`upload` writes a new version of dataset NAME (`NAME/v<k>/`, its manifest committed last:
amlhpc/jobs/data/versions.py) and prints its number; jobs stage the latest committed version
unless their input names one. `--resume K` finishes version K after a failed or interrupted
upload. `--register-asset` registers the version as an Azure ML data asset (name, version)
in the stack's workspace; with Azurite or `--offline` it prints the entity it would create.
`versions` lists a dataset's committed versions and those being written.

`upload` follows symbolic links; entries it cannot upload (a link loop, a dangling link,
a FIFO, an unreadable file) are listed with their reason and make it exit 1 once the rest
is uploaded, unless `--allow-skips`. Another upload committing the same blob first makes
this one fail for that blob, naming the other (amlhpc/jobs/data/upload.py). `seal` records a
checksum for every blob under the prefix that has none (amlhpc/jobs/data/seal.py), so staging
verifies another tool's blobs like the uploader's own.

Exit codes: 0 done, 1 some files failed or were skipped (the rest are uploaded; re-run
to finish), 2 bad input (nothing uploaded), 130 interrupted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.progress import Progress as RichProgressBar
from rich.table import Table

from amlhpc.core import invocation
from amlhpc.core.errors import Problem, ProblemCollector, UserError, exit_with
from amlhpc.jobs.azure import credentials
from amlhpc.jobs.data import seal as sealer
from amlhpc.jobs.data import upload as uploader
from amlhpc.jobs.data import versions
from amlhpc.jobs.runtime.base.throttle import Throttle
from amlhpc.jobs.runtime.blob import blobio

app = typer.Typer(help="Datasets in the stack's storage account.", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)
err = Console(stderr=True)
DEFAULT_CONTAINER = "datasets"


@app.callback()
def _group() -> None:
    """Datasets in the stack's storage account."""
    # A callback keeps `upload` a subcommand even while it is the only one.


@dataclass
class Target:
    """Where an upload goes; `description` is safe to print (no key, no SAS)."""

    container: Any
    description: str
    create_if_missing: bool
    auth: str = "DefaultAzureCredential"


def _outputs(stack: str, outputs_file: Path | None, offline: bool):
    from amlhpc.jobs.plan import outputs

    return outputs.load(stack, outputs_file=outputs_file, offline=offline).outputs


def resolve_target(stack: str, *, outputs_file: Path | None, offline: bool, connection_string_env: str | None,
                   container: str | None, env: dict[str, str] | None = None, max_connections: int = 32) -> Target:
    """The container client for an upload (see the module docstring); UserError on bad options."""
    env = dict(os.environ) if env is None else env
    if connection_string_env:
        connection_string = env.get(connection_string_env, "")
        if not connection_string.strip():
            raise UserError([Problem("--connection-string-env", connection_string_env,
                                     f"environment variable {connection_string_env} is not set or empty",
                                     f"export {connection_string_env}=<Azurite connection string> (see amlhpc/jobs/local/azurite.py), "
                                     "or drop the option to upload to the stack's account")], "invalid options")
        name = container
        if name is None and (outputs_file is not None or offline):
            name = _outputs(stack, outputs_file, offline).storage.containers.get("datasets")
        name = name or DEFAULT_CONTAINER
        credentials.check_container_name(name)
        try:
            client = blobio.container_client(name, connection_string=connection_string, max_connections=max_connections)
        except blobio.BlobConfigError as exc:
            raise UserError([Problem("--connection-string-env", connection_string_env, str(exc),
                                     "check the variable's value")], "invalid options") from None
        where = f"{blobio.safe_endpoint(connection_string=connection_string)}/{name}"
        return Target(client, where, create_if_missing=True, auth=f"connection string from ${connection_string_env}")
    if offline:
        raise UserError([Problem("--offline", "", "the offline plan names planned accounts, not a deployed one: "
                                 "there is nothing to upload to",
                                 "drop --offline to use the deployed stack, pass --outputs FILE, or add "
                                 "--connection-string-env VAR to upload to Azurite")], "invalid options")
    outs = _outputs(stack, outputs_file, offline)
    name = container or outs.storage.containers.get("datasets")
    if not name:
        raise UserError([Problem(f"stack {stack} outputs", "storage.containers.datasets", "is missing",
                                 f"run `pulumi up --stack {stack}` or pass --container")], "invalid stack outputs")
    credentials.check_container_name(name)
    client = blobio.container_client(name, account_url=outs.storage.blob_endpoint,
                                     credential=credentials.credential(credentials.STORAGE), max_connections=max_connections)
    return Target(client, f"{blobio.safe_endpoint(outs.storage.blob_endpoint)}/{name}", create_if_missing=False)


def _check_inputs(local_dir: Path, prefix: str, workers: int | None, level: int, cap_mbps: float | None,
                  member_mib: float = uploader.gzmembers.DEFAULT_MEMBER_BYTES / (1 << 20)) -> None:
    found = ProblemCollector("command line", "invalid options")
    if not local_dir.exists():
        found.add("LOCAL_DIR", f"{local_dir} does not exist", "give the directory holding the dataset files")
    elif not local_dir.is_dir():
        found.add("LOCAL_DIR", f"{local_dir} is a file, not a directory", "give the directory that contains it")
    clean = uploader.normalize_prefix(prefix)
    if not clean:
        found.add("--prefix", f"{prefix!r} is empty", "name the dataset, e.g. --prefix cosmoflow/2019-03")
    elif any(part in ("..", ".") for part in PurePosixPath(clean).parts) or "\\" in clean or "//" in clean:
        found.add("--prefix", f"{prefix!r} is not a clean blob path", "use '/'-separated names without '.', '..' or '//'")
    elif len(clean) > 512:
        found.add("--prefix", f"is {len(clean)} characters long", "keep it under 512 (blob names are at most 1024)")
    if workers is not None and workers < 1:
        found.add("--workers", f"{workers} is below 1", "use at least 1 (default: one per CPU)")
    if not 0 <= level <= 9:
        found.add("--level", f"{level} is outside 0-9", "0-3 use isal (fast, default 1), 4-9 use zlib (smaller, slower)")
    if cap_mbps is not None and cap_mbps <= 0:
        found.add("--cap-mbps", f"{cap_mbps} is not positive", "give megabits per second, or leave it out for no cap")
    if not 1 <= member_mib <= 4096:
        found.add("--member-mib", f"{member_mib:g} is outside 1-4096", "MiB of input per gzip member (default 8): "
                  "files larger than this inflate on several cores when staged")
    found.raise_if_any()


class RichProgress(uploader.Progress):
    """The upload's progress bar: uncompressed bytes, MB/s, stored bytes, files."""

    def __init__(self, console: Console):
        self.bar = RichProgressBar(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                                   DownloadColumn(), TransferSpeedColumn(), TextColumn("{task.fields[stored]}"),
                                   TextColumn("{task.fields[files]}"), TimeRemainingColumn(), console=console,
                                   transient=False)
        self.task: TaskID | None = None  # from start()
        self.stored = 0
        self.done = 0
        self.total_files = 0

    def start(self, files: int, total_bytes: int) -> None:
        self.total_files = files
        self.bar.start()
        self.task = self.bar.add_task("gzip+upload", total=total_bytes or 1, stored="", files=f"0/{files} files")

    def advance(self, uncompressed: int, stored: int) -> None:
        self.stored += stored
        if self.task is not None:
            self.bar.update(self.task, advance=uncompressed, stored=f"-> {self.stored / 1e6:,.1f} MB gz")

    def file_done(self, rel: str, action: str) -> None:
        self.done += 1
        if self.task is not None:
            self.bar.update(self.task, files=f"{self.done}/{self.total_files} files")

    def stop(self) -> None:
        self.bar.stop()


Stack = Annotated[str, typer.Option("--stack", help="Stack whose outputs name the dataset account and container.")]


@app.command("upload")
def upload_command(
    local_dir: Annotated[Path, typer.Argument(help="Directory holding the dataset; its tree is kept below the prefix.")],
    stack: Stack,
    prefix: Annotated[str, typer.Option("--prefix", help="Blob prefix (the dataset's name), e.g. cosmoflow/2019-03.")],
    outputs_file: Annotated[Path | None, typer.Option("--outputs", help="Stack outputs from a JSON file; wins over the deployed stack.")] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Container name from the offline plan (with --connection-string-env only).")] = False,
    connection_string_env: Annotated[str | None, typer.Option("--connection-string-env", help="Upload to the account in this variable's connection string (Azurite); wins over the stack's account.")] = None,
    container: Annotated[str | None, typer.Option("--container", help="Container; wins over the stack's storage.containers.datasets.")] = None,
    workers: Annotated[int | None, typer.Option("--workers", help="Files compressed and uploaded at once (default: one per CPU).")] = None,
    level: Annotated[int, typer.Option("--level", help="Compression level: 0-3 isal (fast), 4-9 zlib (smaller, slower).")] = uploader.DEFAULT_LEVEL,
    member_mib: Annotated[float, typer.Option("--member-mib", help="MiB of input per gzip member; larger files are staged on several cores.")] = uploader.gzmembers.DEFAULT_MEMBER_BYTES / (1 << 20),
    resume: Annotated[int | None, typer.Option("--resume", help="Finish version K of the dataset (after a failed or interrupted upload of the same folder) instead of starting a new one.")] = None,
    register_asset: Annotated[bool, typer.Option("--register-asset", help="Register the version as an Azure ML data asset (name, version) in the stack's workspace; with Azurite or --offline, print the entity instead.")] = False,
    checksum: Annotated[bool, typer.Option("--checksum", help="Hash every file to decide whether it changed, whatever its size, times and inode say.")] = False,
    rewrite: Annotated[bool, typer.Option("--rewrite", help="With --resume: upload every file of the version again.")] = False,
    verify_stored: Annotated[bool, typer.Option("--verify-stored", help="With --resume: read every blob's stored bytes and upload again those that differ from their recorded checksums.")] = False,
    allow_skips: Annotated[bool, typer.Option("--allow-skips", help="Exit 0 even when some entries (link loops, dangling links, FIFOs, unreadable files) could not be uploaded; they are still listed.")] = False,
    cap_mbps: Annotated[float | None, typer.Option("--cap-mbps", help="Cap the upload bandwidth, megabits per second.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of the short error block.")] = False,
) -> None:
    """Compress LOCAL_DIR's files with gzip and upload them as a new version of dataset PREFIX (PREFIX/v<k>/, its manifest committed last)."""
    try:
        _check_inputs(local_dir, prefix, workers, level, cap_mbps, member_mib)
        if resume is not None and resume < 1:
            raise UserError([Problem("--resume", str(resume), "is not a version number",
                                     f"the version the failed upload printed; list them: {_versions_hint(stack, prefix)}")],
                            "invalid options")
        target = resolve_target(stack, outputs_file=outputs_file, offline=offline,
                                connection_string_env=connection_string_env, container=container,
                                max_connections=max(16, 4 * (workers or os.cpu_count() or 2)))
        walked = uploader.scan_all(local_dir)
        files = walked.files
        if not files and not walked.skipped:
            raise UserError([Problem(str(local_dir), "", "holds no files", "point LOCAL_DIR at the dataset")], "invalid options")
        _ensure_container(target, stack)
    except UserError as exc:
        exit_with(exc, debug)

    clean = uploader.normalize_prefix(prefix)
    skipping = f", skipping {len(walked.skipped)} entries (listed at the end)" if walked.skipped else ""
    which = f"version {resume} of" if resume is not None else "a new version of"
    err.print(f"uploading {len(files)} files ({sum(f.size for f in files) / 1e6:,.1f} MB) from {local_dir} as {which} "
              f"{target.description}/{clean}/ ({target.auth}) with {uploader.compressor_name(level)}{skipping}",
              highlight=False)
    progress = RichProgress(err)
    try:
        committed = versions.upload_version(target.container, local_dir, clean, resume=resume, workers=workers,
                                            level=level, throttle=Throttle.from_mbits_per_s(cap_mbps),
                                            progress=progress, files=files, member_bytes=int(member_mib * (1 << 20)),
                                            rewrite=rewrite, verify_stored=verify_stored, skipped=walked.skipped,
                                            allow_skips=allow_skips, checksum=checksum)
        report = committed.upload
    except uploader.NameLimitError as exc:
        progress.stop()
        err.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    except uploader.UploadError as exc:
        progress.stop()
        err.print(f"[red]error:[/] {exc}", highlight=False)
        _print_skipped(walked.skipped, allow_skips)
        if json_out and exc.report is not None:
            print(json.dumps(exc.report.to_json(), indent=2))
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        progress.stop()
        err.print("interrupted: blobs already committed are complete; re-run to upload the rest", highlight=False)
        raise typer.Exit(130) from None
    except Exception as exc:
        progress.stop()
        if debug:
            raise
        known = credentials.explain(exc, target=target.description, role=credentials.BLOB_DATA_ROLE)
        err.print(f"[red]error:[/] {known.render() if known else uploader.describe_azure_error(exc)}", highlight=False)
        raise typer.Exit(1) from None
    progress.stop()
    _print_report(report, f"{clean}/v{committed.version}")
    if committed.unchanged:
        err.print(f"{local_dir} holds version {committed.version} of {clean} unchanged: no new version", highlight=False)
    else:
        err.print(f"committed version {committed.version} of {clean}: {committed.files} files, "
                  f"{committed.bytes / 1e6:,.1f} MB stored, manifest {committed.manifest} (digest {committed.digest}); "
                  f"jobs stage it as the latest, or by number (\"version\": {committed.version})", highlight=False)
    if register_asset:
        _register(committed, stack, target, outputs_file, offline, debug)
    _print_skipped(report.skipped, allow_skips)
    if json_out:
        print(json.dumps(committed.to_json(), indent=2))
    if report.skipped and not allow_skips:
        raise typer.Exit(1)


def _versions_hint(stack: str, prefix: str) -> str:
    return invocation.command("jobs", f"data versions --stack {stack} --prefix {prefix}")


def _register(committed: versions.VersionReport, stack: str, target: Target, outputs_file: Path | None, offline: bool,
              debug: bool) -> None:
    """Register the version as an Azure ML data asset, or show the entity when there is no workspace to register in."""
    datastore = "workspaceblobstore"
    outs = None
    if outputs_file is not None or offline or target.auth == "DefaultAzureCredential":
        try:
            outs = _outputs(stack, outputs_file, offline)
            datastore = outs.datastores.get("datasets", datastore)
        except UserError as exc:
            exit_with(exc, debug)
    entity = versions.asset(committed.dataset, committed.version, datastore)
    if outs is None or offline or target.auth != "DefaultAzureCredential":
        err.print("data asset (not registered: no workspace with --offline or Azurite):\n"
                  + json.dumps(entity._to_dict(), indent=1, default=str), highlight=False)
        return
    from amlhpc.jobs.azure.submit import connect

    try:
        created = connect(outs).data.create_or_update(entity)
    except Exception as exc:
        if debug:
            raise
        err.print(f"[red]error:[/] the version is committed, but registering the data asset failed: "
                  f"{uploader.describe_azure_error(exc)}", highlight=False)
        raise typer.Exit(1) from None
    err.print(f"registered data asset {created.name}:{created.version} ({created.path})", highlight=False)


@app.command("versions")
def versions_command(
    stack: Stack,
    prefix: Annotated[str, typer.Option("--prefix", help="The dataset's name (its blob prefix), e.g. cosmoflow/2019-03.")],
    outputs_file: Annotated[Path | None, typer.Option("--outputs", help="Stack outputs from a JSON file; wins over the deployed stack.")] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Container name from the offline plan (with --connection-string-env only).")] = False,
    connection_string_env: Annotated[str | None, typer.Option("--connection-string-env", help="Use the account in this variable's connection string (Azurite); wins over the stack's account.")] = None,
    container: Annotated[str | None, typer.Option("--container", help="Container; wins over the stack's storage.containers.datasets.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the versions as JSON on stdout.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of the short error block.")] = False,
) -> None:
    """List a dataset's committed versions (the latest is what jobs stage by default) and those being written."""
    try:
        clean = uploader.normalize_prefix(prefix)
        if not clean:
            raise UserError([Problem("--prefix", repr(prefix), "is empty", "name the dataset, e.g. --prefix cosmoflow")],
                            "invalid options")
        target = resolve_target(stack, outputs_file=outputs_file, offline=offline,
                                connection_string_env=connection_string_env, container=container)
    except UserError as exc:
        exit_with(exc, debug)
    try:
        found = versions.list_versions(target.container, clean)
    except Exception as exc:
        if debug:
            raise
        err.print(f"[red]error:[/] {uploader.describe_azure_error(exc)}", highlight=False)
        raise typer.Exit(1) from None
    err.print(f"{clean}: {found.describe()}; latest: {found.latest if found.latest is not None else 'none'}",
              highlight=False)
    if json_out:
        print(json.dumps({"dataset": clean, "committed": sorted(found.committed), "writing": sorted(found.writing),
                          "latest": found.latest}, indent=2))


def _print_skipped(skipped: list, allowed: bool) -> None:
    if not skipped:
        return
    shown = "\n  - ".join(item.line() for item in skipped[:20])
    more = f"\n  ... and {len(skipped) - 20} more" if len(skipped) > 20 else ""
    verdict = ("accepted (--allow-skips)" if allowed else
               "fix or remove them and re-run, or pass --allow-skips to accept the dataset without them")
    err.print(f"[yellow]skipped:[/] {len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'} not uploaded; {verdict}:"
              f"\n  - {shown}{more}", highlight=False)


@app.command("seal")
def seal_command(
    stack: Stack,
    prefix: Annotated[str, typer.Option("--prefix", help="Blob prefix of the dataset to seal, e.g. imagenet/2012.")],
    reseal: Annotated[list[str] | None, typer.Option("--reseal", help="Record the checksum of this blob again (full blob name; after restoring its bytes from the source). Repeatable.")] = None,
    outputs_file: Annotated[Path | None, typer.Option("--outputs", help="Stack outputs from a JSON file; wins over the deployed stack.")] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Container name from the offline plan (with --connection-string-env only).")] = False,
    connection_string_env: Annotated[str | None, typer.Option("--connection-string-env", help="Use the account in this variable's connection string (Azurite); wins over the stack's account.")] = None,
    container: Annotated[str | None, typer.Option("--container", help="Container; wins over the stack's storage.containers.datasets.")] = None,
    workers: Annotated[int, typer.Option("--workers", help="Blobs read at once.")] = 4,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of the short error block.")] = False,
) -> None:
    """Record a checksum (Content-MD5, and SHA-256 in metadata) for every blob under PREFIX that has none, so staging verifies it."""
    try:
        found = ProblemCollector("command line", "invalid options")
        clean = uploader.normalize_prefix(prefix)
        if not clean:
            found.add("--prefix", f"{prefix!r} is empty", "name the dataset's prefix, e.g. --prefix imagenet/2012")
        if workers < 1:
            found.add("--workers", f"{workers} is below 1", "use at least 1")
        found.raise_if_any()
        target = resolve_target(stack, outputs_file=outputs_file, offline=offline,
                                connection_string_env=connection_string_env, container=container)
        if not credentials.check_container(target.container, target=target.description, grant=""):
            raise UserError([Problem(target.description, "", "container does not exist",
                                     "check --container or the stack outputs")], "invalid target")
    except UserError as exc:
        exit_with(exc, debug)
    err.print(f"sealing blobs under {target.description}/{clean}/ ({target.auth})", highlight=False)
    try:
        report = sealer.seal_prefix(target.container, clean, reseal=reseal or (), workers=workers)
    except sealer.SealError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None
    except Exception as exc:
        if debug:
            raise
        known = credentials.explain(exc, target=target.description, role=credentials.BLOB_DATA_ROLE)
        err.print(f"[red]error:[/] {known.render() if known else uploader.describe_azure_error(exc)}", highlight=False)
        raise typer.Exit(1) from None
    err.print(f"{report.blobs} blob(s) under {clean}/: {len(report.sealed)} sealed ({report.bytes_read / 1e6:,.1f} MB "
              f"read), {report.already} already had a checksum", highlight=False)
    if json_out:
        print(json.dumps(report.to_json(), indent=2))


def _ensure_container(target: Target, stack: str) -> None:
    from azure.core.exceptions import ResourceExistsError

    grant = (f"add your object id to aml-hpc:storage.dataContributors in Pulumi.{stack}.yaml and `pulumi up`"
             if target.auth == "DefaultAzureCredential" else "")
    if credentials.check_container(target.container, target=target.description, grant=grant):
        return
    if target.create_if_missing:
        try:
            target.container.create_container()
        except ResourceExistsError:
            pass
        return
    raise UserError([Problem(target.description, "", "container does not exist",
                             f"deploy the stack first: pulumi up --stack {stack}")], "invalid target")


def _print_report(report: uploader.UploadReport, prefix: str) -> None:
    table = Table(title=f"upload to {prefix}/", show_header=True)
    for column in ("files", "uploaded", "unchanged", "refreshed", "verified", "skipped", "MB in", "MB stored", "ratio",
                   "seconds", "MB/s"):
        table.add_column(column, justify="right")
    table.add_row(str(report.files), str(report.uploaded), str(report.unchanged), str(report.refreshed),
                  str(report.verified), str(len(report.skipped)),
                  f"{report.bytes_in / 1e6:,.1f}", f"{report.bytes_stored / 1e6:,.1f}",
                  f"{report.ratio:.2f}x" if report.bytes_stored else "-", f"{report.seconds:.1f}", f"{report.mb_per_s:,.1f}")
    err.print(table)
    if report.remote_only:
        err.print(f"note: {len(report.remote_only)} blob(s) under {prefix}/ have no local file and were left alone "
                  f"(e.g. {report.remote_only[0]})", highlight=False)
    if report.repaired:
        err.print(f"note: {report.repaired} blob(s) whose stored bytes differed from their checksums were uploaded "
                  "again", highlight=False)
