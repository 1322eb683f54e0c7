"""Which checkpoint an attempt restores when any job can write the checkpoints container
(amlhpc/jobs/runtime/checkpoint/trust.py, store.py, amlhpc/jobs/managed/evidence.py): the
manifest is bound to its pointer by digest, and a managed attempt follows only its own
pointer or the version its controller checked."""

from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

import pytest

from amlhpc.jobs.managed.evidence import Evidence
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.checkpoint import CheckpointStore
from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError, UnsafeCheckpoint
from amlhpc.jobs.runtime.checkpoint.trust import (
    Pin,
    RestoreTrust,
    keys_json,
    parse_keys,
    parse_pins,
    pins_document,
    pins_json,
)
from amlhpc.jobs.runtime.coord import nodestatus

pytestmark = pytest.mark.azurite

SECRET = "7c" * 32
PREFIX = "runs/llm"


def attempt_env(job: str | None, pins: dict[str, Pin] | None = None, earlier: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment a managed attempt's launcher gets (None: a job outside the run, unsigned;
    `earlier`: the run's earlier attempts, whose keys the controller hands over)."""
    if job is None:
        return {contract.RUN_ID: "someone-else"}
    env = {contract.RUN_ID: job, contract.EVIDENCE_KEY: nodestatus.attempt_key(SECRET, job)}
    if pins is not None:
        env[contract.RESTORE_PIN] = pins_json(pins_document(pins))
        env[contract.EARLIER_KEYS] = keys_json({a: nodestatus.attempt_key(SECRET, a) for a in earlier})
    return env


def commit(container, tmp_path: Path, job: str | None, step: int, stream: str = PREFIX) -> str:
    """A version committed from `job`'s environment (its pointer signed when it is an attempt)."""
    folder = tmp_path / f"{job}-{step}"
    folder.mkdir(parents=True)
    (folder / f"ckpt-{step:09d}.pt").write_bytes(bytes([step]) * (step + 1))
    with mock.patch.dict(os.environ, attempt_env(job)):
        os.environ.pop("AZUREML_RUN_ID", None)
        return CheckpointStore(container, stream).upload(folder).version


def store_in(container, job: str | None, pins: dict[str, Pin] | None, stream: str = PREFIX,
             earlier: tuple[str, ...] = ()) -> CheckpointStore:
    """The store as a launcher of `job` builds it (node.py: trust from its environment)."""
    with mock.patch.dict(os.environ, attempt_env(job, pins, earlier)):
        os.environ.pop("AZUREML_RUN_ID", None)
        trust = RestoreTrust.from_environ(os.environ, stream)
    return CheckpointStore(container, stream, trust=trust)


def pin_of(container, version: str, stream: str = PREFIX) -> Pin:
    pointer, _ = CheckpointStore(container, stream).pointer()
    assert pointer is not None and pointer["version"] == version
    return Pin(version, pointer["manifestSha256"])


def forge_manifest(container, version: str, stream: str = PREFIX) -> None:
    """Another job rewrites a committed manifest: the same version, its file's digest swapped."""
    name = f"{stream}/manifests/{version}.json"
    manifest = json.loads(container.get_blob_client(name).download_blob().readall())
    manifest["files"][0]["sha256"] = "ab" * 32
    container.upload_blob(name, json.dumps(manifest).encode(), overwrite=True)


class TestTheManifestIsBoundToItsPointer:
    def test_the_pointer_carries_its_manifests_digest(self, container, tmp_path):
        version = commit(container, tmp_path, None, 3)
        store = CheckpointStore(container, PREFIX)
        assert store.pointer()[0]["manifestSha256"] == store.manifest(version).digest

    def test_a_manifest_rewritten_after_the_commit_is_refused(self, container, tmp_path):
        version = commit(container, tmp_path, None, 3)
        forge_manifest(container, version)
        with pytest.raises(UnsafeCheckpoint, match="not the manifest its pointer committed"):
            CheckpointStore(container, PREFIX).latest()
        with pytest.raises(UnsafeCheckpoint):
            CheckpointStore(container, PREFIX).restore(tmp_path / "restored")
        assert not (tmp_path / "restored").exists() or not any((tmp_path / "restored").iterdir())

    def test_fields_a_reader_ignores_do_not_count(self, container, tmp_path):
        version = commit(container, tmp_path, None, 3)
        name = f"{PREFIX}/manifests/{version}.json"
        manifest = json.loads(container.get_blob_client(name).download_blob().readall())
        container.upload_blob(name, json.dumps({**manifest, "note": "x"}, indent=2).encode(), overwrite=True)
        assert CheckpointStore(container, PREFIX).latest().version == version


class TestAManagedAttemptRestoresWhatItsControllerChecked:
    def test_a_pointer_another_job_wrote_is_passed_over_for_the_pin(self, container, tmp_path, caplog):
        checked = commit(container, tmp_path, "llm-a1", 3)
        pins = {PREFIX: pin_of(container, checked)}
        commit(container, tmp_path, None, 9)  # another job commits over the run's stream
        latest = store_in(container, "llm-a2", pins).latest()
        assert latest is not None and latest.version == checked
        assert "passed over: unsigned" in caplog.text

    def test_the_pinned_manifest_rewritten_is_refused(self, container, tmp_path):
        checked = commit(container, tmp_path, "llm-a1", 3)
        pins = {PREFIX: pin_of(container, checked)}
        forge_manifest(container, checked)
        with pytest.raises(UnsafeCheckpoint):
            store_in(container, "llm-a2", pins).latest()

    def test_its_own_newer_commit_is_followed(self, container, tmp_path):
        checked = commit(container, tmp_path, "llm-a1", 3)
        pins = {PREFIX: pin_of(container, checked)}
        own = commit(container, tmp_path, "llm-a2", 6)  # before a requeue or an in-job restart
        assert store_in(container, "llm-a2", pins).latest().version == own

    def test_its_own_pointer_older_than_the_pin_is_passed_over(self, container, tmp_path, caplog):
        old = commit(container, tmp_path, "llm-a2", 2)
        saved = container.get_blob_client(f"{PREFIX}/latest").download_blob().readall()
        checked = commit(container, tmp_path, "llm-a2", 5)
        pins = {PREFIX: pin_of(container, checked)}
        container.upload_blob(f"{PREFIX}/latest", saved, overwrite=True)  # put back by another job
        assert store_in(container, "llm-a2", pins).latest().version == checked
        assert f"older than {checked}" in caplog.text and old in caplog.text

    def test_nothing_pinned_starts_fresh_whatever_the_pointer_says(self, container, tmp_path, caplog):
        commit(container, tmp_path, "other-run-a1", 4)  # signed, but by no attempt of this run
        assert store_in(container, "llm-a1", {PREFIX: Pin(None)}).latest() is None
        assert "starting fresh" in caplog.text

    def test_a_job_without_a_pin_takes_the_pointer_as_found(self, container, tmp_path):
        version = commit(container, tmp_path, None, 4)
        assert store_in(container, "llm-a1", None).latest().version == version

    def test_a_stream_the_pin_does_not_name_follows_only_the_runs_own_signatures(self, container, tmp_path, caplog):
        """A `per_node` writer's node-k stream: not pinned (the controller does not read them),
        followed only when an attempt of the run signed it (failed before: taken as found)."""
        node1 = f"{PREFIX}/node-1"
        pins = {f"{PREFIX}/node-0": Pin(None)}
        commit(container, tmp_path, None, 4, stream=node1)  # unsigned: another job's
        assert store_in(container, "llm-a2", pins, node1, earlier=("llm-a1",)).latest() is None
        assert "passed over: unsigned" in caplog.text and "starts fresh" in caplog.text
        commit(container, tmp_path, "other-run-a1", 5, stream=node1)  # signed, by another run's attempt
        assert store_in(container, "llm-a2", pins, node1, earlier=("llm-a1",)).latest() is None
        earlier = commit(container, tmp_path, "llm-a1", 6, stream=node1)  # the run's first attempt
        assert store_in(container, "llm-a2", pins, node1, earlier=("llm-a1",)).latest().version == earlier
        own = commit(container, tmp_path, "llm-a2", 7, stream=node1)  # this attempt, before a restart
        assert store_in(container, "llm-a2", pins, node1, earlier=("llm-a1",)).latest().version == own

    def test_edited_earlier_keys_are_refused_naming_the_variable(self):
        with pytest.raises(CheckpointError, match=contract.EARLIER_KEYS):
            parse_keys('{"llm-a1": 7}')

    def test_an_edited_pin_is_refused_naming_the_variable(self):
        with pytest.raises(CheckpointError, match=contract.RESTORE_PIN):
            parse_pins('{"runs/llm": {"version": 7}}')
        with pytest.raises(CheckpointError, match=contract.RESTORE_PIN):
            parse_pins("[]")


class TestTheControllerPinsWhatItChecked:
    def test_a_replayed_pointer_pins_the_newest_version_seen(self, container, tmp_path):
        first = commit(container, tmp_path, "llm-a1", 4)
        saved = container.get_blob_client(f"{PREFIX}/latest").download_blob().readall()
        second = commit(container, tmp_path, "llm-a2", 8)
        digest = pin_of(container, second).manifest_sha256
        container.upload_blob(f"{PREFIX}/latest", saved, overwrite=True)
        checked = Evidence(container, PREFIX, secret=SECRET).checked(["llm-a1", "llm-a2"], second, {second: digest})
        assert checked.version == second
        assert checked.pins[PREFIX] == Pin(second, digest)
        assert f"older than {second}" in checked.refused[0] and first in checked.refused[0]

    def test_a_forged_pointer_pins_nothing_for_its_stream(self, container, tmp_path):
        commit(container, tmp_path, None, 4)
        checked = Evidence(container, PREFIX, secret=SECRET).checked(["llm-a1"])
        assert checked.version is None and checked.pins[PREFIX] == Pin(None)
        assert checked.pins[f"{PREFIX}/versions"] == Pin(None), "no pointer there: nothing to restore"

    def test_each_attempt_is_created_with_the_pin_and_restores_it(self, container, tmp_path):
        from tests.managed_fakes import PREEMPTION, Step
        from tests.managed_harness import Harness, new_managed_plan, running, write_template

        plan = new_managed_plan()
        preempted = Step("Failed", error=PREEMPTION, node_states=("preempted",), started_h=0, ended_h=1)
        h = Harness(container, write_template(tmp_path, plan), plan, {1: [running(), preempted], 2: [running()]})
        h.supervisor.store.acquire()
        h.supervisor.tick()  # attempt 1 created: nothing to restore
        first_job = h.record().attempts[0].job
        env1 = h.azure.created[0].environment_variables
        assert json.loads(env1[contract.RESTORE_PIN]) == {
            f"{h.prefix}/versions": {"version": None, "manifestSha256": None},
            h.prefix: {"version": None, "manifestSha256": None}}
        with mock.patch.dict(os.environ, {contract.RUN_ID: first_job,
                                          contract.EVIDENCE_KEY: env1[contract.EVIDENCE_KEY]}):
            os.environ.pop("AZUREML_RUN_ID", None)
            folder = tmp_path / "a1"
            folder.mkdir()
            (folder / "ckpt.pt").write_bytes(b"w" * 64)
            version = CheckpointStore(container, h.prefix).upload(folder).version
        h.supervisor.tick()  # the controller sees the commit (and its manifest's digest)
        assert h.record().attempts[0].commit_seen[0] == version
        commit(container, tmp_path, None, 9, stream=h.prefix)  # another job moves `latest` afterwards
        for _ in range(20):
            if len(h.azure.created) > 1:
                break
            h.clock.sleep(600)
            h.supervisor.tick()
        h.supervisor.store.release()
        attempts = h.record().attempts
        assert len(attempts) == 2, [a.cause for a in attempts]
        env2 = h.azure.created[1].environment_variables
        assert json.loads(env2[contract.EARLIER_KEYS]) == {first_job: env1[contract.EVIDENCE_KEY]}
        assert json.loads(env1[contract.EARLIER_KEYS]) == {}, "the first attempt knows no other"
        pinned = json.loads(env2[contract.RESTORE_PIN])[h.prefix]
        assert pinned["version"] == version and attempts[1].resumed_version == version
        assert pinned["manifestSha256"] == CheckpointStore(container, h.prefix).manifest(version).digest
        with mock.patch.dict(os.environ, env2):
            os.environ.pop("AZUREML_RUN_ID", None)
            trust = RestoreTrust.from_environ(os.environ, h.prefix)
        assert CheckpointStore(container, h.prefix, trust=trust).latest().version == version
