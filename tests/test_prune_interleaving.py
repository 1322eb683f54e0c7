"""Prune against a commit that lands between its reads: prune read `latest`, then
listed the manifests; a commit in between looked like the leftover of a dead committer, and
prune deleted the manifest `latest` then named. Now it lists the manifests first, keeps a
manifest newer than `latest` while it is young, and reads the pointer again before it deletes."""

from __future__ import annotations

import os

import pytest

from amlhpc.jobs.runtime.checkpoint import CheckpointStore
from tests.test_checkpoint_faults import assert_consistent, tree, write

pytestmark = pytest.mark.azurite


class CommitDuringPrune(CheckpointStore):
    """A store whose prune sees a rival's whole commit land right after each of its pointer reads."""

    def __init__(self, *args, rival=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.rival, self.landed = rival, []

    def pointer(self):
        found = super().pointer()
        if self.rival is not None and not self.landed:
            store, folder = self.rival
            self.landed.append(store.upload(folder, keep=10).version)
        return found


@pytest.mark.parametrize("keep", [1, 2])
def test_a_commit_between_the_pointer_and_the_manifests(container, tmp_path, keep):
    base = CheckpointStore(container, "run")
    base.upload(write(tmp_path / "v1", {"a.bin": os.urandom(5000)}), keep=10)
    rival_folder = write(tmp_path / "v2", {"a.bin": os.urandom(5000), "b.bin": b"2"})
    pruner = CommitDuringPrune(container, "run", rival=(CheckpointStore(container, "run", node=1), rival_folder))
    pruner.prune(keep)
    assert pruner.landed, "the rival's commit never landed during the prune"
    assert base.pointer()[0]["version"] == pruner.landed[0]
    assert base.manifest(pruner.landed[0]) is not None, "prune deleted the manifest `latest` names"
    assert_consistent(base, tmp_path, tree(rival_folder))
