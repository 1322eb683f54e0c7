"""Where the simulated Blob service follows Azure beyond what Azurite checks: the published
targets (503 ServerBusy with Retry-After, per account and per blob), Blob's hard limits, lost
replies and the SDK's retries on virtual time, request counting, and Resource Manager's 429s."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ServiceResponseError
from azure.storage.blob import BlobBlock

from amlhpc.jobs.runtime.blob.blobio import RetrySettings
from amlhpc.sim.arm import MLClient
from amlhpc.sim.faults import FaultPlan, RequestFault
from amlhpc.sim.limits import ArmLimits, BlobLimits
from amlhpc.sim.world import ACCOUNT, World

NO_RETRY = RetrySettings(total=0, connect=0, read=0, status=0)


def test_past_the_per_blob_target_the_service_answers_503_with_retry_after_and_counts_it():
    with World(seed=1, limits=BlobLimits(blob_requests_per_s=50.0)) as world:
        container = world.container("c", retry=NO_RETRY)
        statuses: list[int] = []

        def hammer() -> None:
            blob = container.get_blob_client("hot")
            blob.upload_blob(b"x", overwrite=True)
            for _ in range(200):
                try:
                    blob.download_blob().readall()
                    statuses.append(200)
                except HttpResponseError as exc:
                    statuses.append(exc.status_code)
                    assert exc.error_code == "ServerBusy" and exc.response.headers["Retry-After"]
        world.call(hammer, node=world.node("n"))
        accounting = world.blob.accounting
    served = statuses.count(200)
    assert 50 <= served <= 60 + 50 * world.now  # the bucket (one second of the target) and its refill
    assert statuses.count(503) == 200 - served
    name, peak = accounting.hottest(ACCOUNT)
    assert name == "c/hot" and peak.total == 201
    assert accounting.principals["job-identity"].total == 201
    assert accounting.throttled["c/hot"] == statuses.count(503)


def test_the_sdks_retries_ride_out_a_throttled_account_on_virtual_time():
    with World(seed=2, limits=BlobLimits(account_requests_per_s=100.0)) as world:
        container = world.container("c")
        nodes = [world.node(f"n{k}") for k in range(10)]
        done: list[float] = []
        for k, node in enumerate(nodes):
            def work(k: int = k) -> None:
                for i in range(30):
                    container.upload_blob(f"n{k}/{i}", b"x")
                done.append(world.now)
            world.spawn(f"w{k}", work, node=node)
        world.run()
        assert len(done) == 10  # 300 writes at 100/s: throttled, retried, all in
        assert max(done) > 2.0
        assert world.blob.accounting.throttled["*account*"] > 0


def test_a_lost_reply_is_retried_by_the_sdk_and_meets_its_own_write():
    faults = FaultPlan([RequestFault("lost-reply", op="put_blob", blob="c/once", reset_s=0.1)])
    with World(seed=3, faults=faults) as world:
        container = world.container("c")
        with pytest.raises(ResourceExistsError):
            world.call(lambda: container.upload_blob("once", b"mine", overwrite=False), node=world.node("n"))
        assert world.blob.accounts[ACCOUNT].containers["c"].blobs["once"].data == b"mine"
        assert faults.requests[0].fired == 1
    faults = FaultPlan([RequestFault("lost-reply", op="get_blob", times=99)])
    with World(seed=3, faults=faults) as world:
        container = world.container("c", retry=RetrySettings(read=2, total=2))
        world.call(lambda: container.upload_blob("x", b"1"))
        with pytest.raises(ServiceResponseError):
            world.call(lambda: container.download_blob("x").readall(), node=world.node("n"))


def test_blobs_hard_limits_hold_where_azurite_does_not_check_them():
    with World(seed=4, limits=BlobLimits(max_committed_blocks=3)) as world:
        container = world.container("c")

        def limits() -> list[str]:
            said = []
            for attempt in (lambda: container.upload_blob("n" * 1025, b"x"),
                            lambda: container.get_blob_client("b").commit_block_list(
                                [BlobBlock(f"id-{i}") for i in range(4)]),
                            lambda: container.delete_blobs(*[f"x{i}" for i in range(257)])):
                try:
                    attempt()
                    said.append("ok")
                except (HttpResponseError, ValueError) as exc:
                    said.append(getattr(exc, "error_code", None) or type(exc).__name__)
            blob = container.get_blob_client("b")
            for i in range(3):
                blob.stage_block(f"id-{i}", b"z")
            world.sim.sleep(8 * 24 * 3600.0)  # uncommitted blocks go a week after the last Put Block
            try:
                blob.commit_block_list([BlobBlock("id-0")])
                said.append("ok")
            except HttpResponseError as exc:
                said.append(exc.error_code)
            return said
        said = world.call(limits, limit_s=9 * 24 * 3600.0)
    assert said == ["InvalidResourceName", "BlockCountExceedsLimit", "ValueError", "InvalidBlockList"]


def test_a_listing_comes_in_pages_of_at_most_5000_with_markers():
    with World(seed=5) as world:
        container = world.container("c")
        for i in range(5003):
            world.blob.call(ACCOUNT, "put_blob", "setup", container="c", blob=f"p/{i:05d}", data=b"")
        names = world.call(lambda: [b.name for b in container.list_blobs(name_starts_with="p/")])
        assert names == [f"p/{i:05d}" for i in range(5003)]
        assert world.blob.accounting.ops["list_blobs"] == 2


def test_resource_manager_throttles_a_principals_writes_and_the_client_honours_retry_after():
    with World(seed=6, arm_limits=ArmLimits(write_per_s=1.0, write_bucket=5.0)) as world:
        client = MLClient(world.arm, "controller")
        times: list[float] = []

        def submit() -> None:
            for i in range(8):
                client.jobs.create_or_update(SimpleNamespace(name=f"job-{i}", tags={}))
                times.append(world.now)
        world.call(submit, node=world.node("controller", principal="controller"))
        assert len(world.arm.jobs) == 8
        assert world.arm.throttled["controller"] >= 2
        assert times[-1] - times[4] >= 2.0  # past the bucket, one write a second
    with World(seed=6, arm_limits=ArmLimits(read_per_s=0.01, read_bucket=1.0)) as world:
        client = MLClient(world.arm, "reader")
        world.arm.create_job(SimpleNamespace(name="j", tags={}))
        got: list[float] = []
        world.call(lambda: [got.append(world.now) for _ in range(3) if client.jobs.get("j")], limit_s=10_000)
        assert got[1] - got[0] >= 99.0 and got[2] - got[1] >= 99.0  # each waited the 429's Retry-After (100 s)


@pytest.mark.parametrize("charge, throttled", [(None, True), (lambda name, size: size / 1000, False)],
                         ids=["every-byte", "charged-at-scale"])
def test_an_accounts_ingress_throttles_by_what_each_write_is_charged(charge, throttled):
    """1 KB/s of ingress: twenty 1 KB writes in a second pass it; charged at a thousandth of
    their size (a scaled simulation's real-sized records), they do not."""
    limits = BlobLimits(account_ingress_gbit_s=8e-6, ingress_charge=charge)
    with World(seed=5, limits=limits) as world:
        container = world.container("c", retry=NO_RETRY)
        refused: list[int] = []

        def write() -> None:
            for i in range(20):
                try:
                    container.upload_blob(f"r{i}", b"x" * 1000)
                except HttpResponseError as exc:
                    refused.append(exc.status_code)
        world.call(write, node=world.node("n"))
    assert bool(refused) is throttled and set(refused) <= {503}
