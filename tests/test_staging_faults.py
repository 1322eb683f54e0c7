"""Staging through a misbehaving storage account (tests/faultproxy.py) still ends byte-identical."""

from __future__ import annotations

import pytest

from amlhpc.jobs.data import upload
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.base.ranks import validated
from amlhpc.jobs.runtime.blob import blobio
from amlhpc.jobs.runtime.staging import stager as staging
from bench.dataset import generate
from tests.faultproxy import FaultProxy
from tests.test_staging import (
    data_files,
    finish,
    launch_nodes,
    make_dataset,
    source_files,
    spec_json,
    upload_dataset,
)

pytestmark = pytest.mark.azurite


def test_drops_busy_and_truncated_bodies_are_survived(azurite, container, tmp_path):
    """Every fault kind happens, staging retries through them, and every byte matches the source."""
    source = make_dataset(tmp_path, files=48)
    generate(source / "large", files_per_universe=1, file_bytes=2 << 20, seed=9)  # fetched in many ranges
    upload.upload_directory(container, source, "cosmoflow", workers=2, block_bytes=128 << 10)
    with FaultProxy(azurite.port, seed=4242, drop=0.08, busy=0.08, truncate=0.08, max_per_request=2) as proxy:
        env = {contract.BLOB_CONNECTION_STRING: proxy.connection_string(azurite), contract.SCRATCH: str(tmp_path / "scratch"),
               contract.REPORT_DIR: str(tmp_path / "reports"), "AMLHPC_RUN_ID": "faults"}
        specs = staging.specs_from_json(spec_json(container.container_name, "local"))
        options = staging.StageOptions(retry=blobio.RetrySettings.fast(), range_bytes=64 << 10, window=4)
        result = staging.stage_inputs(specs, validated(0, 0, 1, 1), options=options, env=env)
    assert data_files(tmp_path / "scratch" / "cosmo") == source_files(source)
    assert proxy.counts["drop"] > 0 and proxy.counts["busy"] > 0 and proxy.counts["truncate"] > 0
    assert result.inputs[0].files_downloaded == len(source_files(source))
    partial = tmp_path / "scratch" / ".amlhpc-staging" / "cosmo" / "partial"
    assert list(partial.iterdir()) == []


def test_two_nodes_sharing_a_directory_through_faults(azurite, container, tmp_path):
    source = make_dataset(tmp_path, files=32)
    upload_dataset(container, source)
    with FaultProxy(azurite.port, seed=7, drop=0.1, busy=0.1, truncate=0.05, max_per_request=2) as proxy:
        results = finish(launch_nodes(proxy.connection_string(azurite), tmp_path,
                                      spec_json(container.container_name, "shared"), nodes=2))
    assert [r[0] for r in results] == [0, 0], [r[3] for r in results]
    assert data_files(tmp_path / "shared" / "cosmo") == source_files(source)
    assert sum(proxy.counts[k] for k in ("drop", "busy", "truncate")) > 0
