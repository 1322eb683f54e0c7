"""One stager per input and node at a time: an exclusive lock, and who holds it.

Two stagers filling the same directory (a second job on the same node and scratch, a
command run by hand next to the job's) would delete each other's partial downloads and
race on the manifest. So staging an input takes `lock-node<k>` in the input's staging
folder with flock (released by the kernel when the holder dies, even by SIGKILL), and
writes who holds it beside it (`lock-node<k>.json`: pid, host, job, since). A second
stager fails at once with `StagingLocked`, naming the holder.

flock is node-local on BeeGFS without global locks and NFS emulates it with POSIX locks;
each node locks its own file, so both are enough. Where a filesystem refuses locks
(ENOLCK, EOPNOTSUPP) staging goes on without one and says so.

Standard library only: ships into the training image.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

log = logging.getLogger("amlhpc.staging")


class StagingLocked(RuntimeError):
    """Another stager holds the input's lock; the message names it."""


class InputLock:
    """`with InputLock(staging_dir, node, input_name, job_id):` (see the module docstring)."""

    def __init__(self, staging_dir: Path, node_index: int, input_name: str, job_id: str):
        self.path = staging_dir / f"lock-node{node_index}"
        self.holder_path = staging_dir / f"lock-node{node_index}.json"
        self.input_name, self.job_id = input_name, job_id
        self._fd: int | None = None

    def __enter__(self) -> InputLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StagingLocked(self._held_by()) from None
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                log.warning("%s: this filesystem refuses locks (%s); staging without one", self.path, exc.strerror)
                return self
            raise
        self._fd = fd
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "job": self.job_id, "since": time.time()}
        tmp = self.holder_path.with_name(f".{self.holder_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(holder))
        os.replace(tmp, self.holder_path)
        return self

    def _held_by(self) -> str:
        try:
            holder = json.loads(self.holder_path.read_text())
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder["since"])))
            who = f"pid {holder['pid']} on {holder['host']} (job {holder['job']}, since {since})"
        except (OSError, ValueError, KeyError, TypeError):
            who = "another process"
        return (f"{who} is staging input {self.input_name!r} into the same directory ({self.path.parent.parent.parent});"
                " wait for it to finish or stop it, then run again")

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            try:
                self.holder_path.unlink()
            except FileNotFoundError:
                pass
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
