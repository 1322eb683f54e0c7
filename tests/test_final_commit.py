"""The final versioned checkpoint commit after in-job restarts, on two nodes in one process: real
restart coordinators on a MemoryStore (the job's store), each node's real checkpoint duties
(amlhpc/jobs/runtime/checkpoint/node.py) on Azurite. A generation that ends after node 0's
report but before node 1's (node 1 adopts the stored end without reporting, so only node 0
stopped its version uploads) must still end with the newest version committed by every node
within seconds, not after the final wait."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.checkpoint import parse_settings, tier
from amlhpc.jobs.runtime.checkpoint.node import NodeCheckpoints
from amlhpc.jobs.runtime.coord.agree import Channel
from amlhpc.jobs.runtime.coord.memstore import MemoryStore
from amlhpc.jobs.runtime.launch import restart
from tests.test_checkpoint_versions import make_version

NODES = 2
FINAL_WAIT_S = 20.0
"""Short enough that a stall fails the test quickly; a commit takes a few 1 s upload polls."""


class Job:
    """Two nodes' checkpoint duties and the job's store, driven generation by generation."""

    def __init__(self, tmp_path: Path, azurite, container):
        self.store = MemoryStore()
        self.tmp_path = tmp_path
        self.channels = [Channel(self.store, node=k, nodes=NODES, base_poll_s=0.01) for k in range(NODES)]
        settings = parse_settings(json.dumps({"container": container.container_name, "prefix": "job",
                                              "interval_s": 3600, "keep": 3}))
        self.nodes = [NodeCheckpoints(settings, node=k, nodes=NODES, local_size=1, world=NODES,
                                      checkpoint_dir=tmp_path / f"node{k}", channel=self.channels[k],
                                      environ={"AMLHPC_BLOB_CONNECTION_STRING": azurite.connection_string})
                      for k in range(NODES)]

    def save(self, step: int, generation: int) -> None:
        """Every rank writes its part of a version (the training of `generation`)."""
        for k, node in enumerate(self.nodes):
            make_version(node.checkpoint_dir, step, [k], NODES, tag=f"g{generation}")

    def coordinator(self, k: int, generation: int, failure: dict) -> restart.Coordinator:
        node = self.nodes[k]
        c = restart.Coordinator(generation=generation, node=k, nodes=NODES, local_size=1,
                                records=restart.NodeRecords(self.tmp_path / f"records{k}", generation),
                                shared=restart.JobAgreement(self.channels[k], generation), limit=3, agree_s=30.0,
                                hooks=restart.Hooks(report=node.restart_report, apply=node.apply))
        c.failure = failure
        return c

    def generation(self, generation: int, failure: dict, order: tuple[int, ...]) -> list[restart.Decision]:
        """The generation fails with `failure`; each node's coordinator reaches its outcome in
        `order`, one after the other (a node late enough to find the decision already stored)."""
        agreement = restart.JobAgreement(self.channels[failure["node"]], generation)
        agreement.publish_failure(failure)
        found: dict[int, restart.Decision] = {}

        def run(k: int) -> None:
            found[k] = self.coordinator(k, generation, failure)._outcome({0: {"status": 143, "cause": "hang"}})

        threads = []
        for k in order:  # the next node starts once this one has decided or reported
            reported = agreement.reported()
            threads.append(threading.Thread(target=run, args=(k,)))
            threads[-1].start()
            deadline = time.monotonic() + 10
            while k not in found and agreement.reported() == reported and time.monotonic() < deadline:
                time.sleep(0.01)
        for t in threads:
            t.join(30)
        return [found[k] for k in range(NODES)]

    def finish(self, last_generation: int) -> tuple[list[list[str]], float]:
        """Every node's final upload at once, as each launcher runs it; (errors per node, seconds)."""
        errors: list[list[str]] = [[] for _ in range(NODES)]

        def run(k: int) -> None:
            errors[k] = self.nodes[k].finish(
                FINAL_WAIT_S, generation_failed=lambda: restart.generation_failed(self.channels[k], last_generation))

        started = time.monotonic()
        threads = [threading.Thread(target=run, args=(k,)) for k in range(NODES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(FINAL_WAIT_S * 3)
        return errors, time.monotonic() - started

    def committed_on(self, k: int) -> str | None:
        path = tier.versions_dir(self.nodes[k].checkpoint_dir) / "committed.json"
        return json.loads(path.read_text())["version"] if path.exists() else None


def hang(node: int) -> dict:
    return {"node": node, "local_rank": 0, "cause": "hang", "status": 143, "message": "no progress"}


@pytest.mark.azurite
def test_an_end_node_1_adopts_without_reporting_still_commits_the_final_version(tmp_path, azurite, container):
    """The rehearsal's defect: restart 1, then node 0 hangs again in generation 1 and ends the job
    (the same node again) right after its own report; node 1 finds that end before it reports.
    Node 0 stopped its uploads for the report, node 1 never did: the final commit must still
    bring both nodes into one upload session."""
    job = Job(tmp_path, azurite, container)
    job.save(4, generation=0)
    for node in job.nodes:
        node.start_uploads()
    first = job.generation(0, hang(0), order=(0, 1))
    assert [(d.result, d.source, d.version) for d in first] == [("restart", "local", "step-000000004")] * NODES
    for node, decision in zip(job.nodes, first, strict=True):
        node.start_uploads(protect={decision.version})
    job.save(6, generation=1)

    second = job.generation(1, hang(0), order=(0, 1))
    assert [(d.result, d.exit_code) for d in second] == [("end", ExitCode.HANG)] * NODES
    assert job.nodes[0].version_uploader is None, "node 0 reported: its uploads stopped"
    assert job.nodes[1].version_uploader is not None, "node 1 adopted the end without reporting"

    errors, took = job.finish(last_generation=1)
    assert errors == [[], []]
    assert took < FINAL_WAIT_S / 2, f"the final commit took {took:.1f}s: a node waited for the others"
    final = tier.blob_version(6, "g1")
    assert job.nodes[0].versions.latest().version == final
    assert [job.committed_on(k) for k in range(NODES)] == [final, final]


@pytest.mark.azurite
def test_a_version_committed_before_the_restart_was_weighed_ends_the_final_wait_at_once(tmp_path, azurite, container):
    """Node 0 committed the newest version while the generation ran, then every node reported
    and the job ended (node 1 hung again): the fresh session of the final upload has nothing to commit, and the
    other nodes hear so from node 0 at once instead of waiting out the final wait."""
    job = Job(tmp_path, azurite, container)
    job.save(4, generation=0)
    for node in job.nodes:
        node.start_uploads()
    first = job.generation(0, hang(1), order=(0, 1))
    for node, decision in zip(job.nodes, first, strict=True):
        node.start_uploads(protect={decision.version})
    job.save(6, generation=1)
    # Blob holds step 6 already (committed by the uploads of generation 1).
    for k, node in enumerate(job.nodes):
        version = tier.read_version(tier.versions_dir(node.checkpoint_dir) / tier.version_name(6))
        node.versions.stage(version.path, version.files([k]), tier.blob_version(6, "g1"))
    job.nodes[0].versions.commit(tier.blob_version(6, "g1"), 6, [0, 1],
                                 {"layout": "versions", "step": 6, "world": NODES, "tag": "g1",
                                  "local": "step-000000006", "nodes": NODES})

    second = job.generation(1, hang(1), order=(1, 0))  # node 1 reports first, then node 0 ends the job
    assert {(d.result, d.exit_code) for d in second} == {("end", ExitCode.HANG)}
    assert [node.version_uploader for node in job.nodes] == [None, None], "both nodes reported"

    errors, took = job.finish(last_generation=1)
    assert errors == [[], []]
    assert took < FINAL_WAIT_S / 2, f"the final upload took {took:.1f}s: a node waited for the others"
    assert job.nodes[0].versions.latest().version == tier.blob_version(6, "g1")
