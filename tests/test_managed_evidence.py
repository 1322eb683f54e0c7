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


class TestReplayedEndRecords:
    """Any job can write the checkpoints container: an earlier epoch's signed end record,
    re-uploaded after Azure ML requeued the attempt, must not be believed (the same bytes get a
    new ETag, so an ETag mark alone let it through)."""

    SECRET = "11" * 32
    JOB = "cosmoflow-a1"

    def setup(self, container):
        from amlhpc.jobs.runtime.coord import nodestatus

        evidence = Evidence(container, "runs/cosmoflow", secret=self.SECRET)
        key = evidence.key(self.JOB)
        nodestatus.write_end(container, "runs/cosmoflow", self.JOB, 1, {"exit_code": 143, "signals": ["SIGTERM"]}, key)
        name = nodestatus.end_name("runs/cosmoflow", self.JOB, 1)
        return evidence, key, name, container.get_blob_client(name).download_blob().readall()

    def test_a_previous_epochs_record_re_uploaded_is_refused(self, container):
        evidence, _, name, saved = self.setup(container)
        assert evidence.ends(self.JOB, 2).records.keys() == {1}  # believed in its own epoch
        marks = evidence.stale_marks(self.JOB)  # Azure ML requeued the job
        container.get_blob_client(name).delete_blob()  # the new epoch's node 1 has not written yet...
        container.upload_blob(name, saved, overwrite=True)  # ...and another job puts the old record back
        ends = evidence.ends(self.JOB, 2, marks)
        assert ends.records == {} and ends.tampered == frozenset()
        assert ends.refused == ["end record of node 1 ignored: written before Azure ML requeued the job (an earlier epoch's)"]

    def test_a_record_from_two_epochs_back_is_refused(self, container):
        from amlhpc.jobs.runtime.coord import nodestatus

        evidence, key, name, saved = self.setup(container)
        marks = evidence.stale_marks(self.JOB)  # first requeue
        nodestatus.write_end(container, "runs/cosmoflow", self.JOB, 1, {"exit_code": 1}, key)  # epoch 2's own end
        assert evidence.ends(self.JOB, 2, marks).records[1]["exit_code"] == 1
        marks = evidence.stale_marks(self.JOB, marks)  # second requeue
        container.upload_blob(name, saved, overwrite=True)  # epoch 1's record replayed in epoch 3
        assert evidence.ends(self.JOB, 2, marks).records == {}

    def test_this_epochs_own_record_is_believed(self, container):
        from amlhpc.jobs.runtime.coord import nodestatus

        evidence, key, _, _ = self.setup(container)
        marks = evidence.stale_marks(self.JOB)
        nodestatus.write_end(container, "runs/cosmoflow", self.JOB, 1, {"exit_code": 0}, key)
        assert evidence.ends(self.JOB, 2, marks).records[1]["exit_code"] == 0
