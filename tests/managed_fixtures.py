"""The managed tests' shared fixtures: the managed plan (built once per test module that uses
it) and its training template, and the policy the supervisor tests start from.

A test module imports the fixtures by name (`from tests.managed_fixtures import managed_plan,
template`); pytest finds a fixture imported into a module as if it were defined there.
"""

from __future__ import annotations

from typing import Any

import pytest

from amlhpc.jobs.managed.policy import Policy
from tests.managed_harness import new_managed_plan, write_template

POLICY: dict[str, Any] = dict(nodes=2, usd_per_node_hour=27.197, expected_hours=12, max_restarts=3, backoff_s=60,
                              backoff_max_s=900, controller_usd_per_hour=0.096, poll_s=30)
"""Two nodes at the ND H100 v5 list price, 12 hours expected, three restarts, a 60 s backoff."""


@pytest.fixture(scope="module")
def managed_plan():
    return new_managed_plan()


@pytest.fixture
def template(tmp_path, managed_plan):
    return write_template(tmp_path, managed_plan)


def policy(**changes: Any) -> Policy:
    """POLICY with `changes`."""
    return Policy(**{**POLICY, **changes})
