"""process_env: variables set for a block and put back as they were, also when the block raises."""

import os

import pytest

from amlhpc.jobs.runtime.base.process_env import process_env


def test_variables_are_set_inside_and_restored_or_removed_after(monkeypatch):
    monkeypatch.setenv("AMLHPC_TEST_KEPT", "before")
    monkeypatch.delenv("AMLHPC_TEST_NEW", raising=False)
    with process_env({"AMLHPC_TEST_KEPT": "inside", "AMLHPC_TEST_NEW": "inside"}):
        assert os.environ["AMLHPC_TEST_KEPT"] == "inside"
        assert os.environ["AMLHPC_TEST_NEW"] == "inside"
    assert os.environ["AMLHPC_TEST_KEPT"] == "before"
    assert "AMLHPC_TEST_NEW" not in os.environ


def test_a_block_that_raises_still_restores(monkeypatch):
    monkeypatch.delenv("AMLHPC_TEST_NEW", raising=False)
    with pytest.raises(RuntimeError), process_env({"AMLHPC_TEST_NEW": "inside"}):
        raise RuntimeError("the block failed")
    assert "AMLHPC_TEST_NEW" not in os.environ
