"""Start and stop Azurite, the Blob-compatible server the tests, the rehearsal and the
benchmarks run against.

Each start gets its own account with a freshly generated key (AZURITE_ACCOUNTS), so no
storage key lives in the repository, and its own data folder and port, so concurrent
runs do not collide. Azurite runs in its own session and gets SIGTERM if the process that
started it dies (amlhpc/jobs/local/processes.py).

    python -m amlhpc.jobs.local.azurite [--location DIR] -- COMMAND...

runs one command against a local Azurite (e.g. `jobs data upload ... --connection-string-env
AMLHPC_BLOB_CONNECTION_STRING`) and stops it afterwards.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from amlhpc.core import invocation, project
from amlhpc.jobs.local import processes

REPO_ROOT = Path(__file__).resolve().parents[3]
AZURITE_COMMAND = "azurite-blob"
"""Azurite's Blob-only server (the npm package `azurite` installs it beside `azurite`)."""
AZURITE_BIN = REPO_ROOT / "node_modules" / ".bin" / AZURITE_COMMAND
"""A clone's own Azurite, at the version package.json pins (`make bootstrap` installs it)."""


class AzuriteNotInstalled(RuntimeError):
    pass


def find(path: str | None = None) -> Path | None:
    """Azurite's blob server: the clone's pinned one (node_modules/.bin), the project's own
    (`npm install azurite` in the project), or the first `azurite-blob` on PATH (`npm install
    --global azurite`); None when there is none."""
    for candidate in (AZURITE_BIN, project.root() / "node_modules" / ".bin" / AZURITE_COMMAND):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(AZURITE_COMMAND, path=path)
    return Path(found) if found else None


def install_hint() -> str:
    """How to get Azurite here (it runs on Node.js 20 or newer)."""
    return (f"install Azurite, Microsoft's Blob emulator, from npm (it needs Node.js 20 or newer): {invocation.azurite()}"
            + ("" if invocation.from_clone() else f", which puts {AZURITE_COMMAND} on PATH"))


def free_port() -> int:
    """A TCP port nothing on 127.0.0.1 listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Azurite:
    """A running Azurite blob service. Use as a context manager or call stop()."""

    account: str
    key: str
    port: int
    workdir: Path
    process: subprocess.Popen | None = field(default=None, repr=False)
    owns_workdir: bool = False

    @property
    def blob_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.account}"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={self.account};AccountKey={self.key};"
            f"BlobEndpoint={self.blob_endpoint};"
        )

    def __enter__(self) -> Azurite:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                # Azurite waits for idle keep-alive connections before exiting (~10 s);
                # nothing it holds needs a clean shutdown.
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def start(workdir: Path | None = None, port: int | None = None, account: str = "amlhpcdev", timeout_s: float = 30.0) -> Azurite:
    """Start Azurite's blob service on 127.0.0.1 and wait until it answers."""
    binary = find()
    if binary is None:
        raise AzuriteNotInstalled(f"{AZURITE_COMMAND} is neither in {AZURITE_BIN.parent} nor on PATH: {install_hint()}")
    owns = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="azurite-")) if workdir is None else workdir
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    key = base64.b64encode(secrets.token_bytes(64)).decode()
    env = {**os.environ, "AZURITE_ACCOUNTS": f"{account}:{key}"}
    log = open(workdir / "azurite.log", "ab")  # noqa: SIM115 - lives as long as the process
    process = subprocess.Popen(
        [str(binary), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(workdir),
         "--skipApiVersionCheck", "--loose", "--silent"],
        stdout=log, stderr=subprocess.STDOUT, env=env, **processes.popen_kwargs(),
    )
    server = Azurite(account, key, port, workdir, process, owns)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Azurite exited with {process.returncode}; see {workdir / 'azurite.log'}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    raise TimeoutError(f"Azurite did not listen on port {port} within {timeout_s}s")


def main(argv: list[str] | None = None) -> int:
    """`python -m amlhpc.jobs.local.azurite [--location DIR] -- COMMAND...`: run COMMAND against a
    local Azurite (AMLHPC_BLOB_CONNECTION_STRING set for it), then stop Azurite. The data
    stays in DIR (default .azurite/, the rehearsal's), so what COMMAND uploads is there for
    `python -m amlhpc.jobs run ... --local`. Exit status: COMMAND's; 2 for bad usage."""
    import argparse
    import sys

    from amlhpc.jobs.runtime.base import contract

    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m amlhpc.jobs.local.azurite",
                                     usage="python -m amlhpc.jobs.local.azurite [--location DIR] -- COMMAND [ARGS...]",
                                     description="Run COMMAND with a local Azurite and AMLHPC_BLOB_CONNECTION_STRING set.")
    parser.add_argument("--location", type=Path, default=REPO_ROOT / ".azurite", help="Azurite's data folder (default .azurite/)")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        parser.error("give the command to run after --")
    try:
        with processes.supervised(), start(args.location) as server:
            env = {**os.environ, contract.BLOB_CONNECTION_STRING: server.connection_string}
            print(f"Azurite at {server.blob_endpoint} (data in {args.location}); running: {' '.join(command)}",
                  file=sys.stderr, flush=True)
            return processes.run_step(command, cwd=Path.cwd(), env=env)
    except processes.Interrupted as stop:
        return stop.exit_code
    except AzuriteNotInstalled as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
