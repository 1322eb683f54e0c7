"""Shared fixtures. Azure's control plane is faked per test (Pulumi mocks, a mocked
MLClient); Blob is always a real Azurite server started here, once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from amlhpc.jobs.local import azurite as azurite_server
from tests import time_box

# pytest-xdist's workers export COLUMNS=80 (the controller's width); a plain run has none, and the
# CLI's tables then size themselves to their content. Tests read the tables the same way in both.
for _variable in ("COLUMNS", "LINES"):
    os.environ.pop(_variable, None)


def pytest_addoption(parser):
    parser.addoption("--keep-file", default=None,
                     help="run only the test ids listed in this file, when it exists (make check's time box, "
                          "tests/time_box.py; scripts/changed_tests.py removes it when it cannot box the run)")


def pytest_collection_modifyitems(config, items):
    path = config.getoption("--keep-file")
    if path and os.path.exists(path):
        keep = set(Path(path).read_text().split("\n"))
        left = [item for item in items if item.nodeid not in keep]
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = [item for item in items if item.nodeid in keep]
    if hasattr(config, "workerinput"):
        # An xdist worker: the files longest first, so that none starts last and runs alone
        # (with --no-loadscope-reorder, the workers take the files in this order).
        by_id = {item.nodeid: item for item in items}
        items[:] = [by_id[i] for i in time_box.longest_first(by_id, time_box.weights(Path(config.rootpath)))]


_times: dict[str, list[float]] = {}


def pytest_runtest_logreport(report):
    """Each test's setup and run time, kept for make check's time box (in the process that
    reports: the xdist controller, or the one process)."""
    times = _times.setdefault(report.nodeid, [0.0, 0.0])
    times[0 if report.when == "setup" else 1] += report.duration


def pytest_sessionfinish(session):
    cache = getattr(session.config, "cache", None)
    if cache is None or hasattr(session.config, "workerinput") or not _times:
        return
    cache.set(time_box.RECORD_KEY, time_box.merged(cache.get(time_box.RECORD_KEY, {}), _times))


@pytest.fixture(scope="session")
def azurite(tmp_path_factory):
    """A running Azurite blob service for the whole session (its own account and key)."""
    with azurite_server.start(tmp_path_factory.mktemp("azurite")) as server:
        yield server


@pytest.fixture
def blob_service(azurite):
    """A BlobServiceClient on the session's Azurite."""
    from azure.storage.blob import BlobServiceClient

    return BlobServiceClient.from_connection_string(azurite.connection_string)


@pytest.fixture
def container(blob_service, request):
    """A fresh, empty container named after the test (deleted afterwards)."""
    import re
    import uuid

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"t-{name}-{uuid.uuid4().hex[:8]}".replace("--", "-")
    client = blob_service.create_container(name)
    yield client
    client.delete_container()


UNPRICED_SIZE = "Standard_ND96isr_H200_v5"
"""A size the unpriced-size tests strip of its catalog price: every size AmlCompute runs is
priced in the catalog, and a region or a newer size without a reference price still happens."""


@pytest.fixture
def unpriced_size(monkeypatch) -> str:
    """The catalog as it would read without a reference price for UNPRICED_SIZE."""
    import dataclasses

    from amlhpc.core import skus

    monkeypatch.setitem(skus._catalog, UNPRICED_SIZE, dataclasses.replace(skus.get(UNPRICED_SIZE), price=None))
    return UNPRICED_SIZE
