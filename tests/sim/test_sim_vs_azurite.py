"""The simulated Blob service answers as Azurite does, where Azurite models Azure: one
sequence of operations (tests/sim/blob_semantics.py: conditions, ETags, leases, block lists,
list pages and markers, metadata, batches, and staging's stdlib reads) through the real SDK
against Azurite and through amlhpc.sim's clients against the simulated service.

Where Azurite is not Azure, the simulation follows Azure and is tested alone
(tests/sim/test_sim_blob.py): Azurite accepts blob names over 1,024 characters and
enforces no request targets."""

from __future__ import annotations

import pytest

from amlhpc.jobs.runtime.blob import blobhttp, blobio
from amlhpc.sim.world import World
from tests.sim.blob_semantics import Recorder, reader_sequence, sequence

pytestmark = pytest.mark.azurite


def _differences(real: Recorder, sim: Recorder) -> list[str]:
    assert [label for label, _ in real.outcomes] == [label for label, _ in sim.outcomes]
    return [f"{label}: Azurite {a}, simulation {b}"
            for (label, a), (_, b) in zip(real.outcomes, sim.outcomes, strict=True) if a != b]


def test_the_sdk_sequence_answers_as_azurite_does(container):
    real = Recorder()
    sequence(container, real)
    with World(seed=1) as world:
        sim = Recorder()
        simulated = world.container("cmp")
        world.call(lambda: sequence(simulated, sim))
    assert len(real.outcomes) > 60
    assert _differences(real, sim) == []
    # the sequence exercised the failures it is about, not only successes
    errors = {outcome[3] for _, outcome in real.outcomes if outcome[0] == "error"}
    assert {"BlobAlreadyExists", "ConditionNotMet", "LeaseAlreadyPresent", "LeaseIdMissing",
            "LeaseIdMismatchWithBlobOperation", "LeaseNotPresentWithBlobOperation", "InvalidBlockList",
            "InvalidBlobOrBlock", "BlobNotFound"} <= errors


def test_stagings_stdlib_reads_answer_as_azurite_does(azurite, container):
    url, auth = blobhttp.auth_from_env(container.container_name, None,
                                       {blobio.CONNECTION_STRING_VARIABLE: azurite.connection_string})
    real = Recorder()
    reader_sequence(container, blobhttp.Reader(url, auth, blobio.RetrySettings.fast()), real)
    with World(seed=2) as world:
        sim = Recorder()
        simulated = world.container("cmp")
        reader = world.reader("cmp", retry=blobio.RetrySettings.fast())
        world.call(lambda: reader_sequence(simulated, reader, sim))
    assert _differences(real, sim) == []
    assert ("range under a stale etag", ("error", "BlobReadError", 412, "ConditionNotMet")) in real.outcomes
