"""Run commands on cluster nodes over SSH: the one seam BeeOND management goes through.

`SshRunner` is the interface (tests use a fake that records commands); `OpenSshRunner`
runs the system `ssh` client:

- key authentication only (`BatchMode=yes`: never a password prompt), with the private
  key passed by path (`-i`). Its contents are never read by this code, never logged,
  never part of a message;
- host keys: `StrictHostKeyChecking=accept-new` against a known_hosts file kept per stack
  and cluster under ~/.cache/aml-hpc/, so a first connection to a new node is accepted and
  a changed key on a known address is refused (the error says which file to clear);
- short connect timeouts and keep-alives, so a dead node fails in seconds, not minutes.

Scripts are sent on stdin to `bash -s` rather than on the command line, so quoting
survives and nothing long shows up in the node's process list.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class SshTarget:
    """One node: where to connect and as whom."""

    node_id: str
    host: str
    port: int
    user: str

    def __str__(self) -> str:
        return f"{self.node_id} ({self.user}@{self.host}:{self.port})"


@dataclass(frozen=True)
class SshResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def tail(self, lines: int = 3) -> str:
        text = (self.stderr or self.stdout or "").strip().splitlines()
        return " | ".join(text[-lines:]) if text else f"exit {self.returncode}, no output"


class SshRunner(Protocol):
    def run(self, target: SshTarget, script: str, timeout_s: float = 120.0) -> SshResult:
        """Run `script` with bash on `target`; never raises for a failing command."""


def default_key() -> Path | None:
    """The first of ~/.ssh/id_ed25519, id_ecdsa, id_rsa that exists."""
    for name in ("id_ed25519", "id_ecdsa", "id_rsa"):
        candidate = Path.home() / ".ssh" / name
        if candidate.is_file():
            return candidate
    return None


def known_hosts_file(stack: str, cluster: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aml-hpc"
    return base / f"known_hosts-{stack}-{cluster}"


class OpenSshRunner:
    """SshRunner over the system `ssh` binary."""

    def __init__(self, key_path: Path, known_hosts: Path, connect_timeout_s: int = 15):
        self.key_path = key_path
        self.known_hosts = known_hosts
        self.connect_timeout_s = connect_timeout_s

    def argv(self, target: SshTarget) -> list[str]:
        return ["ssh", "-i", str(self.key_path), "-p", str(target.port),
                "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                "-o", "StrictHostKeyChecking=accept-new", "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", f"ConnectTimeout={self.connect_timeout_s}", "-o", "ServerAliveInterval=15",
                "-o", "ServerAliveCountMax=4", "-o", "LogLevel=ERROR",
                f"{target.user}@{target.host}", "bash", "-s"]

    def run(self, target: SshTarget, script: str, timeout_s: float = 120.0) -> SshResult:
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run(self.argv(target), input=script, capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return SshResult(124, "", f"no answer within {timeout_s:.0f}s")
        except FileNotFoundError:
            return SshResult(127, "", "the `ssh` client is not installed on this machine")
        stderr = done.stderr
        if "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr or "Host key verification failed" in stderr:
            stderr += (f"\nthe node's host key differs from the one recorded in {self.known_hosts}; if the node was "
                       "re-imaged, delete that file and retry")
        return SshResult(done.returncode, done.stdout, stderr)
