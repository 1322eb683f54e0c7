"""What a new attempt resumes from, as the controller records it (amlhpc/jobs/managed/evidence.py):
the versioned stream's commit when the training checkpoints in versions, else the folder's."""

from __future__ import annotations

from pathlib import Path

import pytest

from amlhpc.jobs.managed.evidence import Evidence
from amlhpc.jobs.runtime.checkpoint import CheckpointStore

pytestmark = pytest.mark.azurite


def commit(container, stream: str, folder: Path, files: dict[str, bytes]) -> str:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return CheckpointStore(container, stream).upload(folder).version


def test_nothing_committed_is_a_fresh_start(container):
    assert Evidence(container, "run").latest_version() is None


def test_the_folder_streams_commit(container, tmp_path):
    version = commit(container, "run", tmp_path / "f", {"ckpt-000000004.pt": b"x"})
    assert Evidence(container, "run").latest_version() == version


def test_a_versioned_commit_is_what_the_launcher_restores(container, tmp_path):
    """The launcher restores `<prefix>/versions` first: the record must name that version, not
    'start' (it did, for every workload on the versioned API)."""
    commit(container, "run", tmp_path / "f", {"ckpt-000000004.pt": b"x"})
    version = commit(container, "run/versions", tmp_path / "v", {"rank-0.json": b"{}"})
    assert Evidence(container, "run").latest_version() == version
