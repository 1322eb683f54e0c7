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


class TestForgedOrReplayedPointer:
    """The `latest` pointer the controller reads (what the next attempt resumes from, and the
    checkpoint rhythm that tells a stalled run) lies where every job can write: it counts only
    when an attempt of the run signed it, and never when it moves back behind a version the
    controller already saw committed."""

    SECRET = "22" * 32
    PREFIX = "runs/cosmoflow"

    def commit(self, container, tmp_path, job: str, secret: str | None, step: int) -> tuple[str, bytes]:
        """A checkpoint committed by `job` (its launcher's environment), and its pointer's bytes."""
        import os
        from unittest import mock

        from amlhpc.jobs.runtime.base import contract
        from amlhpc.jobs.runtime.coord import nodestatus

        env = {contract.RUN_ID: job, **({contract.EVIDENCE_KEY: nodestatus.attempt_key(secret, job)} if secret else {})}
        with mock.patch.dict(os.environ, env):
            os.environ.pop("AZUREML_RUN_ID", None)
            version = commit(container, self.PREFIX, tmp_path / f"{job}-{step}", {f"ckpt-{step:09d}.pt": b"w" * step})
        store = CheckpointStore(container, self.PREFIX)
        return version, container.get_blob_client(store.pointer_name).download_blob().readall()

    def test_the_attempts_own_pointer_is_believed(self, container, tmp_path):
        version, _ = self.commit(container, tmp_path, "cosmoflow-a1", self.SECRET, 4)
        evidence = Evidence(container, self.PREFIX, secret=self.SECRET)
        assert evidence.latest(["cosmoflow-a1"]) == (version, [])

    @pytest.mark.parametrize("writer, secret, why", [
        ("cosmoflow-a1", None, "unsigned"),
        ("cosmoflow-a1", "33" * 32, "its signature does not verify (not written by cosmoflow-a1)"),
        ("other-run-a1", "22" * 32, "signed for 'other-run-a1', which is no attempt of this run"),
    ], ids=["unsigned", "another-runs-key", "another-runs-attempt"])
    def test_a_forged_pointer_is_refused(self, container, tmp_path, writer, secret, why):
        self.commit(container, tmp_path, writer, secret, 4)
        version, refused = Evidence(container, self.PREFIX, secret=self.SECRET).latest(["cosmoflow-a1"])
        assert version is None
        assert refused == [f"checkpoint pointer {self.PREFIX}/latest ignored: {why}"]

    def test_a_pointer_edited_after_signing_is_refused(self, container, tmp_path):
        import json

        _, saved = self.commit(container, tmp_path, "cosmoflow-a1", self.SECRET, 4)
        pointer = json.loads(saved)
        pointer["version"] = "000000099-forged"
        container.upload_blob(f"{self.PREFIX}/latest", json.dumps(pointer).encode(), overwrite=True)
        version, refused = Evidence(container, self.PREFIX, secret=self.SECRET).latest(["cosmoflow-a1"])
        assert version is None and "does not verify" in refused[0]

    def test_an_earlier_genuine_pointer_replayed_is_refused(self, container, tmp_path):
        first, saved = self.commit(container, tmp_path, "cosmoflow-a1", self.SECRET, 4)
        second, _ = self.commit(container, tmp_path, "cosmoflow-a2", self.SECRET, 8)
        evidence = Evidence(container, self.PREFIX, secret=self.SECRET)
        assert evidence.latest(["cosmoflow-a1", "cosmoflow-a2"], floor=first) == (second, [])
        container.upload_blob(f"{self.PREFIX}/latest", saved, overwrite=True)  # a job puts the old pointer back
        version, refused = evidence.latest(["cosmoflow-a1", "cosmoflow-a2"], floor=second)
        assert version is None
        assert refused == [f"checkpoint pointer {self.PREFIX}/latest ignored: it names {first}, older than {second} "
                           "already seen committed (a replayed pointer)"]


class TestTheControllerIgnoresAForgedPointer:
    def test_a_forged_pointer_neither_counts_as_a_commit_nor_becomes_what_the_next_attempt_resumes(
            self, container, tmp_path):
        from tests.managed_harness import Harness, new_managed_plan, running, write_template

        plan = new_managed_plan()
        h = Harness(container, write_template(tmp_path, plan), plan, {1: [running(), running(), running()]})
        h.supervisor.store.acquire()
        h.supervisor.tick()  # attempt 1 submitted
        forged = tmp_path / "forged"
        with_commit = TestForgedOrReplayedPointer()
        with_commit.PREFIX = h.prefix
        with_commit.commit(container, forged, "someone-else", None, 7)  # a job of another run writes `latest`
        h.supervisor.tick()
        h.supervisor.store.release()
        attempt = h.record().attempts[0]
        assert attempt.commit_seen == [], "no checkpoint counted: the stall and budget rules see none"
        assert any("checkpoint pointer" in why and "unsigned" in why for why in attempt.ignored_evidence)
