"""A checkpoint's block, block list or pending record rides out an account that answers busy for
longer than the client's own retries (about two minutes): it is sent again until the account takes
it (amlhpc/jobs/runtime/checkpoint/store.py, BUSY_LIMIT_S). Before, the part failed after the
client's retries, and every failed part was uploaded again in the next round, adding to the load
that caused it. On the runtime's clock, virtual here."""

from __future__ import annotations

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

from amlhpc.jobs.runtime.base import clock
from amlhpc.jobs.runtime.checkpoint import store as store_module
from amlhpc.jobs.runtime.checkpoint.store import CheckpointStore
from amlhpc.jobs.runtime.coord import pacing
from tests.virtual_clock import VirtualClock


def busy() -> HttpResponseError:
    error = HttpResponseError(message="Ingress is over the account limit. ErrorCode:ServerBusy")
    error.status_code = 503
    return error


class BusyFor:
    """A blob client whose stage_block answers busy until `seconds` of the clock have passed."""

    def __init__(self, seconds: float, error=busy):
        self.until, self.error, self.staged = clock.monotonic() + seconds, error, []

    def stage_block(self, block_id, chunk, **_):
        if clock.monotonic() < self.until:
            raise self.error()
        self.staged.append(block_id)


@pytest.fixture
def store():
    with clock.use(VirtualClock()):
        yield CheckpointStore(container=None, stream="exp/run", node=0)


def test_a_storm_of_ten_minutes_delays_the_block_and_fails_nothing(store):
    client = BusyFor(600.0)
    started = clock.monotonic()
    store._stage_block(client, "s00000000", b"x")
    assert client.staged == ["s00000000"] and store.busy_retries > 30
    assert 600.0 <= clock.monotonic() - started <= 600.0 + 1.3 * store_module.BUSY_MAX_PAUSE_S


def test_past_the_limit_it_is_a_fault(store):
    with pytest.raises(HttpResponseError, match="ServerBusy"):
        store._stage_block(BusyFor(2 * store_module.BUSY_LIMIT_S), "s00000000", b"x")


def test_other_errors_are_not_waited_out(store):
    with pytest.raises(ResourceNotFoundError):
        store._stage_block(BusyFor(60.0, error=lambda: ResourceNotFoundError("gone")), "s00000000", b"x")
    assert store.busy_retries == 0


def test_a_cancel_is_heard_between_tries(store):
    store.cancel.set()
    with pytest.raises(store_module.UploadCancelled):
        store._stage_block(BusyFor(60.0), "s00000000", b"x")


def test_the_nodes_first_blocks_are_spread_over_one_block_time():
    """1,000 nodes each capped at 11.25 MB/s (90 % of four 25 Gb/s accounts, shared) with 256 MiB
    blocks: node k starts k/1000 of one block's 23.9 s after node 0."""
    rate, block = 4 * 25e9 / 8 * 0.9 / 1000, 256 << 20
    offsets = [pacing.byte_offset_s(k, 1000, block, rate) for k in range(1000)]
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert offsets[-1] == pytest.approx(block / rate * 0.999)
    assert pacing.byte_offset_s(5, 1, block, rate) == pacing.byte_offset_s(5, 1000, block, 0.0) == 0.0
