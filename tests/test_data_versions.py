"""Versioned datasets: `jobs data upload` writes a new version and commits its manifest last;
staging stages exactly one committed version, from its manifest, the same on every node."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from amlhpc.jobs.data import versions
from amlhpc.jobs.data.upload import UploadError
from amlhpc.jobs.runtime.base import contract, faultpoints
from amlhpc.jobs.runtime.base.ranks import validated
from amlhpc.jobs.runtime.coord.agree import Channel
from amlhpc.jobs.runtime.coord.memstore import MemoryStore
from amlhpc.jobs.runtime.staging import dataversion
from amlhpc.jobs.runtime.staging import stager as staging
from tests.test_staging import FAST, data_files, source_files, upload_dataset

pytestmark = pytest.mark.azurite


def folder(root: Path, tag: str, names: list[str]) -> Path:
    path = root / tag
    for name in names:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(f"{tag}:{name}:".encode() * 300)
    return path


def stage(azurite, container, tmp_path: Path, *, node: int = 0, nodes: int = 1, version=None, channel=None,
          reader_factory=None, prefix: str = "ds", mode: str = "local"):
    env = {contract.BLOB_CONNECTION_STRING: azurite.connection_string,
           contract.SCRATCH: str(tmp_path / f"scratch{node}"), contract.REPORT_DIR: str(tmp_path / "reports"),
           "AMLHPC_RUN_ID": "versions-test", "AMLHPC_LAUNCH_ID": f"launch-{node}-{uuid.uuid4().hex[:6]}"}
    entry = {"name": "ds", "container": container.container_name, "prefix": prefix, "mode": mode}
    if version is not None:
        entry["version"] = version
    specs = staging.specs_from_json(json.dumps([entry]))
    return staging.stage_inputs(specs, validated(node, 0, nodes, 1), options=FAST, env=env, channel=channel,
                                reader_factory=reader_factory)


NAMES = ["a.bin", "b.bin", "sub/c.bin", "d.bin"]


class TestUploadVersion:
    def test_each_upload_is_a_new_version_with_its_manifest_last(self, container, tmp_path):
        first = versions.upload_version(container, folder(tmp_path, "v1", NAMES), "ds", workers=2)
        second = versions.upload_version(container, folder(tmp_path, "v2", NAMES[1:] + ["e.bin"]), "ds", workers=2)
        assert (first.version, second.version) == (1, 2)
        names = {b.name for b in container.list_blobs(name_starts_with="ds/")}
        assert {"ds/v1/a.bin.gz", "ds/v2/e.bin.gz", "ds/_versions/1.json", "ds/_versions/2.json"} <= names
        assert not {n for n in names if n.endswith(".uploading")}  # markers go once committed
        manifest = json.loads(container.download_blob("ds/_versions/2.json").readall())
        assert manifest["format"] == dataversion.FORMAT and manifest["version"] == 2
        assert sorted(row[0] for row in manifest["files"]) == sorted(f"ds/v2/{n}.gz" for n in NAMES[1:] + ["e.bin"])
        assert all(row[5]["amlhpc_sha256"] and row[2] for row in manifest["files"])  # hashes and etags
        assert manifest["digest"] == dataversion.files_digest(manifest["files"]) == second.digest
        found = versions.list_versions(container, "ds")
        assert (sorted(found.committed), found.writing, found.latest) == ([1, 2], {}, 2)

    def test_an_unchanged_folder_makes_no_new_version(self, container, tmp_path):
        source = folder(tmp_path, "v1", NAMES)
        versions.upload_version(container, source, "ds", workers=2)
        again = versions.upload_version(container, source, "ds", workers=2)
        assert again.unchanged and again.version == 1
        (source / "a.bin").write_bytes(b"changed")
        assert versions.upload_version(container, source, "ds", workers=2).version == 2

    def test_a_version_stopped_before_its_manifest_is_never_staged_and_can_be_finished(self, azurite, container, tmp_path):
        source = folder(tmp_path, "v1", NAMES)
        versions.upload_version(container, source, "ds", workers=2)
        changed = folder(tmp_path, "v2", NAMES + ["new.bin"])
        with faultpoints.injected("dataset.files-uploaded", faultpoints.raising("killed")), \
                pytest.raises(faultpoints.FaultInjected):
            versions.upload_version(container, changed, "ds", workers=2)
        assert versions.list_versions(container, "ds").writing == {2: "ds/_versions/2.uploading"}
        latest = stage(azurite, container, tmp_path)
        assert latest.inputs[0].version == 1
        assert data_files(Path(latest.inputs[0].data_dir)) == source_files(source)
        with pytest.raises(staging.StagingError, match="version 2 of ds is still being written"):
            stage(azurite, container, tmp_path, version=2)
        finished = versions.upload_version(container, changed, "ds", resume=2, workers=2)
        assert finished.version == 2 and finished.upload.unchanged == 5  # nothing sent twice
        assert stage(azurite, container, tmp_path).inputs[0].version == 2
        with pytest.raises(UploadError, match="committed, and a committed version never changes"):
            versions.upload_version(container, changed, "ds", resume=2, workers=2)

    def test_two_uploads_never_share_a_version(self, container, tmp_path):
        # Another upload claimed 1 between this one's listing and its marker: this one takes 2.
        container.upload_blob("ds/_versions/1.uploading", json.dumps({"session": "other"}).encode())
        assert versions._claim(container, "ds", "mine") == 2
        # A lost reply on our own marker write: the retry's 409 finds our own session, and keeps it.
        container.upload_blob("ds/_versions/3.uploading", json.dumps({"session": "again"}).encode())
        assert versions._create_or_own(container, "ds/_versions/3.uploading", b"{}",
                                       lambda data: json.loads(data)["session"] == "again")

    def test_skipped_entries_leave_the_version_uncommitted_unless_allowed(self, container, tmp_path):
        source = folder(tmp_path, "v1", NAMES)
        (source / "dangling").symlink_to(source / "nowhere")
        with pytest.raises(UploadError, match="version 1 of ds is not committed: 1 entry could not be uploaded"):
            versions.upload_version(container, source, "ds", workers=2, allow_skips=False)
        assert versions.list_versions(container, "ds").committed == {}
        assert versions.upload_version(container, source, "ds", resume=1, workers=2).version == 1


class TestStagingFromTheManifest:
    def test_staging_reads_the_manifest_and_lists_no_data(self, azurite, container, tmp_path):
        versions.upload_version(container, folder(tmp_path, "v1", NAMES), "ds", workers=2)
        listed: list[str] = []
        result = stage(azurite, container, tmp_path, reader_factory=counting_reader(azurite, listed, "list_page"))
        assert listed == ["ds/_versions/"]  # one page of versions; the files come from the manifest
        assert result.inputs[0].files_total == 4 and result.inputs[0].version == 1

    def test_a_named_version_stages_exactly_that_version(self, azurite, container, tmp_path):
        first = folder(tmp_path, "v1", NAMES)
        versions.upload_version(container, first, "ds", workers=2)
        versions.upload_version(container, folder(tmp_path, "v2", NAMES[:2]), "ds", workers=2)
        result = stage(azurite, container, tmp_path, version=1)
        assert data_files(Path(result.inputs[0].data_dir)) == source_files(first)
        with pytest.raises(staging.StageConfigError, match="7: no such committed version of ds"):
            stage(azurite, container, tmp_path, version=7)

    def test_nodes_that_resolved_latest_apart_stage_one_version(self, azurite, container, tmp_path):
        """Node 0 plans from version 1; version 2 is committed; node 1 finds it the latest, and adopts node 0's."""
        first = folder(tmp_path, "v1", NAMES)
        versions.upload_version(container, first, "ds", workers=2)
        store = MemoryStore()
        zero = stage(azurite, container, tmp_path, node=0, nodes=2, channel=Channel(store, node=0, nodes=2))
        versions.upload_version(container, folder(tmp_path, "v2", ["x.bin", "y.bin"]), "ds", workers=2)
        one = stage(azurite, container, tmp_path, node=1, nodes=2, channel=Channel(store, node=1, nodes=2))
        assert zero.inputs[0].version == one.inputs[0].version == 1
        assert zero.inputs[0].manifest_digest == one.inputs[0].manifest_digest
        together = {**data_files(Path(zero.inputs[0].data_dir)), **data_files(Path(one.inputs[0].data_dir))}
        assert together == source_files(first)

    @pytest.mark.parametrize("mode", ["local", "replica", "shared"])
    def test_nodes_that_planned_from_different_listings_refuse_in_every_mode(self, azurite, container, tmp_path, mode):
        """An un-versioned prefix that changed between two nodes' listings (node 0's digest stands for its
        listing): the second node refuses, in local and replica mode as in shared."""
        source = folder(tmp_path, "v1", NAMES)
        upload_dataset(container, source, prefix="flat")
        store = MemoryStore()
        extra = {}
        if mode == "shared":
            (tmp_path / "shared").mkdir()
            extra = {contract.SHARED_DIR: str(tmp_path / "shared")}
        env = {contract.BLOB_CONNECTION_STRING: azurite.connection_string, contract.SCRATCH: str(tmp_path / "s"),
               contract.REPORT_DIR: str(tmp_path / "reports"), "AMLHPC_RUN_ID": "apart", "AMLHPC_LAUNCH_ID": "l1",
               **extra}
        specs = staging.specs_from_json(json.dumps([{"name": "ds", "container": container.container_name,
                                                     "prefix": "flat", "mode": mode}]))
        key = staging.jobid.identify(env).key(staging.jobid.inputs_digest(specs, 2, 1))
        scoped = Channel(store, node=1, nodes=2).scoped("staging", key, "ds")
        scoped.decide(scoped.key("plan"), {"version": None, "digest": "0123456789abcdef", "node": 0})
        with pytest.raises(staging.StagingError, match="node 1 planned from a listing .* node 0 from a listing"):
            staging.stage_inputs(specs, validated(1, 0, 2, 1), options=FAST, env=env,
                                 channel=Channel(store, node=1, nodes=2))

    def test_an_unversioned_prefix_still_stages_and_refuses_a_version_number(self, azurite, container, tmp_path):
        source = folder(tmp_path, "flat", NAMES)
        upload_dataset(container, source, prefix="ds")
        result = stage(azurite, container, tmp_path)
        assert result.inputs[0].version is None
        assert data_files(Path(result.inputs[0].data_dir)) == source_files(source)
        with pytest.raises(staging.StageConfigError, match="holds no versions"):
            stage(azurite, container, tmp_path, version=1)

    def test_a_changed_manifest_is_refused(self, azurite, container, tmp_path):
        versions.upload_version(container, folder(tmp_path, "v1", NAMES), "ds", workers=2)
        doc = json.loads(container.download_blob("ds/_versions/1.json").readall())
        doc["files"] = doc["files"][1:]
        container.upload_blob("ds/_versions/1.json", json.dumps(doc).encode(), overwrite=True)
        with pytest.raises(staging.StagingError, match="do not match its digest"):
            stage(azurite, container, tmp_path)

    def test_several_nodes_without_the_jobs_store_are_refused(self, azurite, container, tmp_path):
        versions.upload_version(container, folder(tmp_path, "v1", NAMES), "ds", workers=2)
        with pytest.raises(staging.StageConfigError, match="needs the job's coordination store"):
            stage(azurite, container, tmp_path, node=0, nodes=2)


def counting_reader(azurite, seen: list[str], method: str = "get"):
    """A reader factory whose readers note the blob (or prefix) of every call of `method`."""
    def make(spec):
        from amlhpc.jobs.runtime.blob import blobhttp, blobio

        url, auth = blobhttp.auth_from_env(spec.container, spec.account_url,
                                           {contract.BLOB_CONNECTION_STRING: azurite.connection_string})
        reader = blobhttp.Reader(url, auth, blobio.RetrySettings.fast())
        real = getattr(reader, method)

        def noting(name, *args, **kwargs):
            seen.append(name)
            return real(name, *args, **kwargs)
        setattr(reader, method, noting)
        return reader
    return make


MANY = [f"f{i:02d}.bin" for i in range(13)]


class TestManifestInParts:
    """Above PART_ROWS files (3 here: 13 files make 5 parts) the manifest is an index of parts,
    and a node reads only the parts that hold its share."""

    @pytest.fixture(autouse=True)
    def small_parts(self, monkeypatch):
        monkeypatch.setattr(dataversion, "PART_ROWS", 3)

    def test_the_upload_writes_the_parts_then_the_index_outside_the_versions_listing(self, container, tmp_path):
        report = versions.upload_version(container, folder(tmp_path, "v1", MANY), "ds", workers=2)
        index = json.loads(container.download_blob("ds/_versions/1.json").readall())
        assert index["format"] == dataversion.INDEX_FORMAT and index["files"] == 13 and len(index["parts"]) == 5
        assert report.digest == index["digest"] and report.files == 13
        rows = [row for ref in index["parts"] for row in json.loads(container.download_blob(ref[0]).readall())["files"]]
        assert [row[0] for row in rows] == [f"ds/v1/{n}.gz" for n in MANY]  # in name order, each once
        assert [b.name for b in container.list_blobs(name_starts_with="ds/_versions/")] == ["ds/_versions/1.json"]

    def test_each_node_reads_the_parts_of_its_share_and_the_nodes_stage_every_file_once(self, azurite, container,
                                                                                          tmp_path):
        source = folder(tmp_path, "v1", MANY)
        versions.upload_version(container, source, "ds", workers=2)
        store, staged, parts_read = MemoryStore(), {}, {}
        for node in range(4):
            gets: list[str] = []
            result = stage(azurite, container, tmp_path, node=node, nodes=4, channel=Channel(store, node=node, nodes=4),
                           reader_factory=counting_reader(azurite, gets))
            staged[node] = data_files(Path(result.inputs[0].data_dir))
            parts_read[node] = [g for g in gets if "/_parts/" in g]
            assert result.inputs[0].balance["rule"] == "contiguous" and result.inputs[0].files_total == 13
        assert sum(map(len, staged.values())) == 13  # no file staged by two nodes
        assert {k: v for files in staged.values() for k, v in files.items()} == source_files(source)
        assert all(1 <= len(read) <= 3 for read in parts_read.values()), parts_read  # of 5 parts
        assert all(staged.values())  # 13 files over 4 nodes: each has some

    def test_replica_nodes_read_every_part_and_hold_everything(self, azurite, container, tmp_path):
        source = folder(tmp_path, "v1", MANY)
        versions.upload_version(container, source, "ds", workers=2)
        store = MemoryStore()
        for node in range(2):
            result = stage(azurite, container, tmp_path, node=node, nodes=2, channel=Channel(store, node=node, nodes=2),
                           mode="replica")
            assert data_files(Path(result.inputs[0].data_dir)) == source_files(source)

    def test_a_changed_part_is_refused(self, azurite, container, tmp_path):
        versions.upload_version(container, folder(tmp_path, "v1", MANY), "ds", workers=2)
        ref = json.loads(container.download_blob("ds/_versions/1.json").readall())["parts"][2]
        body = container.download_blob(ref[0]).readall()
        at = body.index(b'"amlhpc_sha256":"') + len(b'"amlhpc_sha256":"')
        forged = body[:at] + (b"1" if body[at:at + 1] == b"0" else b"0") + body[at + 1:]  # one digest, one digit
        assert len(forged) == len(body) and forged != body
        container.upload_blob(ref[0], forged, overwrite=True)
        with pytest.raises(staging.StagingError, match=f"{ref[0]}: its files do not match the index"):
            stage(azurite, container, tmp_path)

    def test_an_upload_stopped_after_its_parts_is_finished_by_a_resume(self, azurite, container, tmp_path):
        """The parts are in, the index is not: the version is not committed; a resume writes the
        same parts again (each meets its own bytes: a lost reply's retry does the same) and commits."""
        source = folder(tmp_path, "v1", MANY)
        with faultpoints.injected("dataset.parts-written", faultpoints.raising("killed")), \
                pytest.raises(faultpoints.FaultInjected):
            versions.upload_version(container, source, "ds", workers=2)
        assert versions.list_versions(container, "ds").writing == {1: "ds/_versions/1.uploading"}
        assert versions.upload_version(container, source, "ds", resume=1, workers=2).version == 1
        assert data_files(Path(stage(azurite, container, tmp_path).inputs[0].data_dir)) == source_files(source)


@pytest.mark.parametrize(("value", "parsed"), [("latest", None), (3, 3), ("12", 12)])
def test_the_version_key_of_a_stage_spec(value, parsed):
    spec = staging.specs_from_json(json.dumps({"name": "d", "container": "c", "prefix": "p", "version": value}))[0]
    assert spec.version == parsed


@pytest.mark.parametrize("value", [0, -1, "v2", True, 1.5])
def test_a_bad_version_is_named(value):
    with pytest.raises(staging.StageConfigError, match=r"\[0\]\.version"):
        staging.specs_from_json(json.dumps({"name": "d", "container": "c", "prefix": "p", "version": value}))


def test_the_data_asset_entity_is_azure_mls_own():
    from azure.ai.ml.entities import Data

    entity = versions.asset("cosmoflow/2019-03", 3, "datasets_store")
    assert isinstance(entity, Data)
    assert (entity.name, entity.version, entity.type) == ("cosmoflow-2019-03", "3", "uri_folder")
    assert entity.path == "azureml://datastores/datasets_store/paths/cosmoflow/2019-03/v3/"
    assert entity._to_dict()["version"] == "3"
