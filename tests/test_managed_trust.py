"""Abuse cases against a managed run, each as the principal that tries it, refused with the
reason asserted:

- a job (the compute identity: at most read on the supervision container) tries to edit
  another run's record, leave a cancel request or take the lease - Azurite refuses it,
  given exactly those rights as a SAS;
- a job leaves a cancel request where it can write (the checkpoints container) - ignored;
- a job forges end records (unsigned, signed with another attempt's key, for a node that
  does not exist) and heartbeats - ignored, with why, and no forged record can make a
  training error retryable;
- someone who may write the record raises its restart count and cost limit - the controller
  obeys its own job definition only."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from amlhpc.jobs.managed.policy import Policy
from amlhpc.jobs.managed.record import cancel_name, record_name
from amlhpc.jobs.runtime.coord import nodestatus
from tests import managed_fixtures
from tests.managed_fakes import Step, end
from tests.managed_harness import SECRET, Harness, completed, failed, running

managed_plan, template = managed_fixtures.managed_plan, managed_fixtures.template  # the shared fixtures

pytestmark = pytest.mark.azurite


@pytest.fixture
def records(blob_service):
    """A second container standing for the stack's supervision container."""
    import uuid

    client = blob_service.create_container(f"supervision-{uuid.uuid4().hex[:8]}")
    yield client
    client.delete_container()


def as_compute_identity(azurite, container):
    """The container as a job sees it: the compute identity's right on the supervision
    container is read at most (listing and reading blobs), expressed as a container SAS."""
    from azure.storage.blob import ContainerClient, ContainerSasPermissions, generate_container_sas

    sas = generate_container_sas(azurite.account, container.container_name, account_key=azurite.key,
                                 permission=ContainerSasPermissions(read=True, list=True),
                                 expiry=datetime.now(UTC) + timedelta(hours=1))
    return ContainerClient(azurite.blob_endpoint, container.container_name, credential=sas)


class TestAJobAgainstTheSupervisionContainer:
    def test_a_job_cannot_edit_the_record_or_cancel_or_take_the_lease(self, azurite, container, records, template,
                                                                       managed_plan):
        from azure.core.exceptions import HttpResponseError

        h = Harness(container, template, managed_plan, {1: [running()]}, records=records)
        job_view = as_compute_identity(azurite, records)
        record = json.loads(job_view.get_blob_client(record_name(h.prefix)).download_blob().readall())
        assert record["run"] == h.run, "reading is allowed (status, diagnostics)"
        record["policy"]["max_restarts"] = 100
        attempts = {
            "edit the record": lambda: job_view.upload_blob(record_name(h.prefix), json.dumps(record), overwrite=True),
            "leave a cancel request": lambda: job_view.upload_blob(cancel_name(h.prefix), b'{"id": "x"}', overwrite=True),
            "take the lease": lambda: job_view.get_blob_client(record_name(h.prefix)).acquire_lease(15),
            "delete the record": lambda: job_view.delete_blob(record_name(h.prefix)),
        }
        for what, act in attempts.items():
            with pytest.raises(HttpResponseError) as refused:
                act()
            assert refused.value.status_code == 403, what
            assert refused.value.error_code == "AuthorizationPermissionMismatch", what
        assert h.record().policy["max_restarts"] == h.policy.max_restarts

    def test_a_cancel_left_where_jobs_can_write_is_ignored(self, container, records, template, managed_plan):
        h = Harness(container, template, managed_plan, {1: [running(), running(), completed()]}, records=records)
        for name in (cancel_name(h.prefix), f"{h.prefix}/supervision-cancel.json"):
            container.upload_blob(name, json.dumps({"id": "forged", "by": "a job"}).encode(), overwrite=True)
        record = h.supervisor.run()
        assert record.state == "succeeded" and record.cancels_handled == []


class TestForgedEvidence:
    def test_unsigned_end_records_cannot_make_a_training_error_retryable(self, container, template, managed_plan):
        """The real nodes failed with exit 1 (signed); a job then overwrites node 1's record
        with a health-gate failure (retryable), unsigned."""
        h = Harness(container, template, managed_plan, {1: [running(), failed(1)], 2: [completed()]})

        def forge(**ctx):
            nodestatus.write_end(container, h.prefix, ctx["job"], 1, end(3, node=1, error="health gate failed"))

        job = f"{h.run}-a1"
        real_get = h.azure.jobs.get

        def get(name):
            entity = real_get(name)
            if name == job and h.azure.status(name) == "Failed":
                forge(job=name)
            return entity

        h.azure.jobs.get = get
        record = h.supervisor.run()
        attempt = record.attempts[0]
        assert (attempt.cause, attempt.retryable) == ("training_error", False), attempt.detail
        assert attempt.ignored_evidence == ["end record of node 1 ignored: unsigned"]
        assert record.state == "failed" and len(h.azure.created) == 1

    def test_a_record_signed_for_another_attempt_or_node_is_refused(self, container, template, managed_plan):
        h = Harness(container, template, managed_plan, {1: [running(), Step("Failed", error=("UserError", "exit 1"),
                                                                             started_h=0, ended_h=1)]})
        job = f"{h.run}-a1"
        other = nodestatus.attempt_key(SECRET, f"{h.run}-a9")
        nodestatus.write_end(container, h.prefix, job, 0, end(3, node=0), key=other)
        mine = nodestatus.attempt_key(SECRET, job)
        nodestatus.write_end(container, h.prefix, job, 7, end(3, node=7), key=mine)
        # node 1's genuine record, copied to node 0's place: signed for node 1
        nodestatus.write_end(container, h.prefix, job, 1, end(1, node=1), key=mine)
        copied = container.get_blob_client(nodestatus.end_name(h.prefix, job, 1)).download_blob().readall()
        container.upload_blob(nodestatus.end_name(h.prefix, job, 0), copied, overwrite=True)
        ends = h.supervisor.evidence.ends(job, nodes=2)
        assert set(ends.records) == {1} and ends.tampered == {0}
        assert sorted(ends.refused) == [
            "end record of node 0 ignored: its signature does not verify (not written by this attempt's node)",
            "end record of node 7 ignored: node 7 does not exist in a 2-node attempt"]

    def test_a_forged_heartbeat_names_no_straggler(self, container, template, managed_plan):
        h = Harness(container, template, managed_plan,
                    {1: [running(beats={0: {"busy_s": 0.1, "step": s}, 1: {"busy_s": 0.1, "step": s}})
                         for s in range(1, 6)] + [completed()]})
        real_get = h.azure.jobs.get

        def get(name):
            entity = real_get(name)
            step = h.azure.state[name].index + 1
            nodestatus.write_heartbeat(container, h.prefix, name, 1, step=step, age_s=0, first_step=0, host="node1-host",
                                       busy_s=0.9)  # a job without the attempt's key
            return entity

        h.azure.jobs.get = get
        record = h.supervisor.run()
        assert record.attempts[0].stragglers == []
        assert "node 1: heartbeat unsigned" in record.attempts[0].ignored_evidence


class TestTheControllersOwnRules:
    def test_a_record_edited_to_raise_restarts_and_the_limit_changes_nothing(self, container, template, managed_plan):
        """While the controller waits between two looks, someone who may write the record
        (breaking the controller's lease to do it) raises max_restarts, lifts the limit and
        makes every cause retryable: the controller takes the lease back and obeys its own
        job definition."""
        preempted = [running(), Step("Failed", error=("UserError", "AzureMLCompute job failed. PreemptionError: x"),
                                     started_h=0, ended_h=0.1)]
        rules = Policy(nodes=2, usd_per_node_hour=1.0, expected_hours=1, max_restarts=1, backoff_s=1, limit_usd=50,
                       limit_source="ceiling")
        h = Harness(container, template, managed_plan, {n: preempted for n in range(1, 6)}, rules)
        edits = []

        def sleep_and_edit(seconds):
            h.clock.sleep(seconds)
            store = h.store()
            record, etag = store.load()
            if record.policy.get("max_restarts") != 100:
                from azure.storage.blob import BlobLeaseClient

                BlobLeaseClient(store.blob).break_lease(lease_break_period=0)
                record.policy.update(max_restarts=100, limit_usd=None, retry_on=["preempted", "training_error", 1])
                store.save(record, etag)
                edits.append(len(record.attempts))

        h.supervisor.sleep = sleep_and_edit
        done = h.supervisor.run()
        assert edits, "the record was edited while the run went on"
        assert done.state == "failed" and "max restarts reached (1 of managed.max_restarts 1)" in done.reason
        assert len(h.azure.created) == 2 and done.policy["max_restarts"] == 1 and done.policy["limit_usd"] == 50
