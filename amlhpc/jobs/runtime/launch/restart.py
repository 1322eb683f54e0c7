"""In-job restart: a failed training run is restarted by the launchers of every node, inside the
same Azure ML job, from the newest versioned checkpoint every node holds on its NVMe.

Azure ML gives a job no way to replace a node: a node whose host is lost ends the job (the
managed run resubmits it). A process that crashes, an NCCL error, a hang the watchdog stops:
none of those needs a new job. So, per training run ("generation" g = 0, 1, ...):

1. every launcher runs its command; when it ends, the launcher records how (node-local
   `restart/g<g>/rank-<lr>.exit.json`): its status and cause (exit, hang, stopped by a signal);
2. the node's leader (local rank 0) watches those records, and the job's failure record in
   Blob (`<prefix>/runs/<run id>/restart/g<g>-failed.json`, create-only: the first failure of
   the generation anywhere). A failure, here or on another node, makes it write `stop.json`:
   every launcher of the node kills its command at once;
3. once its commands have all ended, the leader cancels the node's uploads, verifies what the
   node holds (tier.py: markers and SHA-256 of every file) and reports it to Blob
   (`g<g>-node-<k>.json`; node 0 adds the committed latest version in Blob);
4. when every node has reported, each leader decides the same thing from the same reports
   (`decide`): the newest version every node holds intact, or the committed one in Blob if that
   is newer (restored into the tier first), or none; versions newer than it are deleted (they
   belong to the abandoned timeline). Its local ranks start their commands again with
   AMLHPC_RESUME_VERSION, AMLHPC_RESTART_GENERATION g+1 and a new timeline tag.

The job ends instead (the node's outcome "end", the launcher's exit status saying why) when:
the launcher itself was told to stop (SIGTERM: preemption, a cancel); the training writes
checkpoint files outside the versioned tier (nodes cannot agree on those: a rank-0 file exists
on one node only); `local_restarts` restarts were spent (exit 11, for the managed run to
resubmit); a node did not report within `agree_s` (exit 10: a lost node); another node ended.
A node that ends publishes `g<g>-ended-node-<k>.json`, so the others do not wait for it.

Blob (the checkpoints container) is the channel between nodes, as for the watchdog's
heartbeats: it needs no port, works when the collectives are what failed, and leaves a record.
Without checkpoint settings only a single-node job restarts in-job.

Standard library plus azure-storage-blob: ships in the image.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amlhpc.jobs.runtime.base import clock as clocks
from amlhpc.jobs.runtime.base.exit_codes import ExitCode
from amlhpc.jobs.runtime.coord import nodestatus

log = logging.getLogger("amlhpc.restart")

POLL_S = 0.1
BLOB_POLL_S = 0.5


# --- records ----------------------------------------------------------------------------


def _write_json(path: Path, document: dict[str, Any]) -> None:
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


class NodeRecords:
    """The node-local records of one generation (every launcher of the node reads and writes them)."""

    def __init__(self, folder: Path, generation: int):
        self.folder = Path(folder) / f"g{generation}"
        self.generation = generation

    def exit_path(self, local_rank: int) -> Path:
        return self.folder / f"rank-{local_rank}.exit.json"

    def record_exit(self, local_rank: int, status: int, cause: str, message: str = "", peer_silent: bool = False) -> None:
        """`peer_silent`: the watchdog stopped the command because another node's launcher went
        silent (frozen or gone): that node cannot restart, so the job ends."""
        _write_json(self.exit_path(local_rank), {"status": status, "cause": cause, "message": message,
                                                 "peer_silent": peer_silent, "written": clocks.time()})

    def exits(self, local_size: int) -> dict[int, dict[str, Any]]:
        found = {r: _read_json(self.exit_path(r)) for r in range(local_size)}
        return {r: d for r, d in found.items() if d is not None}

    @property
    def stop_path(self) -> Path:
        return self.folder / "stop.json"

    def request_stop(self, failure: dict[str, Any]) -> None:
        if not self.stop_path.exists():
            _write_json(self.stop_path, failure)

    def stop_requested(self) -> dict[str, Any] | None:
        return _read_json(self.stop_path)

    @property
    def outcome_dir(self) -> Path:
        return self.folder / "outcome"


class JobRecords:
    """The records nodes exchange through Blob, beside the node status (nodestatus.run_folder)."""

    def __init__(self, container, prefix: str, run_id: str, generation: int):
        self.container = container
        self.base = f"{nodestatus.run_folder(prefix, run_id)}restart/g{generation}-"

    def _put(self, name: str, document: dict[str, Any], create_only: bool = False) -> bool:
        from azure.core.exceptions import ResourceExistsError

        try:
            self.container.upload_blob(self.base + name, json.dumps(document).encode(), overwrite=not create_only)
            return True
        except ResourceExistsError:
            return False

    def _get(self, name: str) -> dict[str, Any] | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            document = json.loads(self.container.get_blob_client(self.base + name).download_blob().readall())
        except (ResourceNotFoundError, ValueError):
            return None
        return document if isinstance(document, dict) else None

    def publish_failure(self, failure: dict[str, Any]) -> bool:
        """The generation's first failure anywhere; False when another node's was first."""
        return self._put("failed.json", failure, create_only=True)

    def failure(self) -> dict[str, Any] | None:
        return self._get("failed.json")

    def report(self, node: int, document: dict[str, Any]) -> None:
        self._put(f"node-{node}.json", document)

    def ended(self, node: int, document: dict[str, Any]) -> None:
        self._put(f"ended-node-{node}.json", document)

    def answers(self) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
        """(reports, ended records) of every node so far, by node index."""
        reports: dict[int, dict[str, Any]] = {}
        ended: dict[int, dict[str, Any]] = {}
        for blob in self.container.list_blobs(name_starts_with=self.base):
            leaf = blob.name[len(self.base):]
            for prefix, target in (("node-", reports), ("ended-node-", ended)):
                number = leaf.removeprefix(prefix).removesuffix(".json")
                if leaf.startswith(prefix) and number.isdigit():
                    document = self._get(leaf)
                    if document is not None:
                        target[int(number)] = document
        return reports, ended


# --- the decision -----------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    result: str
    """restart, or end."""
    reason: str
    source: str | None = None
    """local, blob or none (a restart from the start)."""
    version: str | None = None
    """The local version folder name (step-N) to resume from."""
    tag: str | None = None
    step: int | None = None
    blob_version: str | None = None
    exit_code: int | None = None
    resume: str | None = None
    """This node's version folder to resume from (filled in by the node, after `apply`)."""
    failure: dict[str, Any] | None = None
    """The generation's first failure (who, cause, status)."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _key(version: dict[str, Any]) -> tuple[int, str, str]:
    return int(version["step"]), str(version["name"]), str(version["tag"])


def spent(limit: int) -> Decision:
    return Decision("end", f"{limit} in-job restart(s) spent (checkpoint.local_restarts)", exit_code=ExitCode.RESTARTS_EXHAUSTED)


def decide(generation: int, limit: int, nodes: int, reports: dict[int, dict[str, Any]],
           ended: dict[int, dict[str, Any]], deadline_passed: bool) -> Decision | None:
    """What every node does after failed generation `generation`; None while answers are missing.
    A function of the reports alone, so every node decides the same."""
    if ended:
        node, record = min(ended.items())
        return Decision("end", f"node {node} ended the job ({record.get('reason', record.get('cause', '?'))})")
    missing = [k for k in range(nodes) if k not in reports]
    if missing:
        if not deadline_passed:
            return None
        return Decision("end", f"node(s) {', '.join(map(str, missing))} did not answer the restart: lost (a host that "
                               "is gone ends the Azure ML job; the managed run resubmits it)", exit_code=ExitCode.NODE_LOST)
    if generation >= limit:
        return spent(limit)
    held = [{_key(v) for v in reports[k].get("versions", [])} for k in range(nodes)]
    common = set.intersection(*held) if held else set()
    local = max(common) if common else None
    blob = reports.get(0, {}).get("blob_latest")
    if blob and (local is None or int(blob["step"]) > local[0]):
        return Decision("restart", f"the newest version every node holds is older than Blob's {blob['version']}",
                        "blob", blob.get("local"), blob.get("tag"), int(blob["step"]), blob["version"])
    if local is not None:
        return Decision("restart", "the newest version every node holds intact", "local", local[1], local[2], local[0])
    return Decision("restart", "no version is held by every node, none in Blob: the training starts over", "none")


# --- the node's leader ------------------------------------------------------------------


@dataclass
class Hooks:
    """What the coordinator asks of its launcher (keeps this module free of the launcher)."""

    report: Callable[[], dict[str, Any]]
    """Cancel the node's uploads; verify the tier; the node's report (versions, folder_files, blob_latest)."""
    apply: Callable[[Decision], Decision]
    """Prepare the node for the decision (restore from Blob, drop newer versions); may turn it into an end."""


class Coordinator:
    """Local rank 0's side of one generation (see the module docstring)."""

    def __init__(self, *, generation: int, node: int, nodes: int, local_size: int, records: NodeRecords,
                 shared: JobRecords | None, limit: int, agree_s: float, hooks: Hooks, clock=clocks.monotonic):
        self.generation, self.node, self.nodes, self.local_size = generation, node, nodes, local_size
        self.records, self.shared, self.limit, self.agree_s, self.hooks, self.clock = (
            records, shared, limit, agree_s, hooks, clock)
        self.failure: dict[str, Any] | None = None
        self.failed_at: float | None = None
        """Monotonic time the node learnt of the failure (for the report's recovery figures)."""

    def _local_failure(self, exits: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
        for rank, record in sorted(exits.items()):
            if record["cause"] == "restart":  # killed by this very mechanism, after the failure
                continue
            if record["status"] != 0 or record["cause"] != "exit":
                return {"node": self.node, "local_rank": rank, **record}
        return None

    def _fail(self, failure: dict[str, Any]) -> None:
        if self.failure is None:
            self.failure, self.failed_at = failure, self.clock()
            log.warning("generation %d failed (node %s, local rank %s: %s, status %s): stopping the node's training",
                        self.generation, failure.get("node"), failure.get("local_rank"), failure.get("cause"),
                        failure.get("status"))
        self.records.request_stop(failure)

    def watch(self) -> Decision:
        """Until every local command has ended: spread a failure. Then the generation's outcome."""
        next_blob = 0.0
        while True:
            exits = self.records.exits(self.local_size)
            local = self._local_failure(exits)
            if local is not None and self.failure is None:
                self._fail(local)
                if self.shared is not None and local["cause"] != "stopped":
                    try:
                        self.shared.publish_failure(local)
                    except Exception as exc:  # noqa: BLE001 - the other nodes' own failures still reach them
                        log.warning("could not publish the failure to the other nodes: %s", exc)
            if self.failure is None and self.shared is not None and self.clock() >= next_blob:
                next_blob = self.clock() + BLOB_POLL_S
                try:
                    remote = self.shared.failure()
                except Exception as exc:  # noqa: BLE001 - judge locally until Blob answers again
                    log.warning("could not read the job's failure record: %s", exc)
                    remote = None
                if remote is not None:
                    self._fail(remote)
            if len(exits) == self.local_size:
                return self._outcome(exits)
            clocks.sleep(POLL_S)

    def _end(self, decision: Decision) -> Decision:
        if self.shared is not None:
            try:
                self.shared.ended(self.node, {"reason": decision.reason, "cause": (self.failure or {}).get("cause", "done")})
            except Exception as exc:  # noqa: BLE001 - the others then wait out agree_s
                log.warning("could not tell the other nodes that this node ends: %s", exc)
        return decision

    def _answered(self, deadline: float) -> Decision | None:
        assert self.shared is not None
        reports, ended = self.shared.answers()
        ended.pop(self.node, None)
        return decide(self.generation, self.limit, self.nodes, reports, ended, self.clock() > deadline)

    def _outcome(self, exits: dict[int, dict[str, Any]]) -> Decision:
        if self.failure is None:
            return self._end(Decision("done", "every command of the node ended well"))
        if self.failure.get("cause") == "stopped" and self.failure.get("node") == self.node:
            return self._end(Decision("end", "the launcher was told to stop (preemption or a cancel)"))
        if self.limit <= 0:
            return self._end(Decision("end", "in-job restarts are off (checkpoint.local_restarts 0)"))
        if self.failure.get("peer_silent"):
            return self._end(Decision("end", f"{self.failure.get('message', 'a node went silent')}: a node whose "
                                             "launcher is frozen or gone cannot restart"))
        if self.nodes > 1 and self.shared is None:
            return self._end(Decision("end", f"{self.nodes} nodes and no checkpoint storage to agree through"))
        if self.generation >= self.limit:
            return self._end(spent(self.limit))
        report = self.hooks.report()
        if report.get("folder_files"):
            return self._end(Decision("end", "the training keeps checkpoint files outside the versioned tier "
                                             "(common.save_state): the nodes cannot agree on those; a new attempt "
                                             "restores them from Blob"))
        if self.shared is None:
            found = decide(self.generation, self.limit, 1, {0: report}, {}, False)
        else:
            self.shared.report(self.node, {**report, "written": clocks.time()})
            deadline = self.clock() + self.agree_s
            while (found := self._answered(deadline)) is None:
                clocks.sleep(BLOB_POLL_S)
        assert found is not None, "one node's own report always decides"
        decision = found
        if decision.result == "restart":
            decision = self.hooks.apply(decision)
        return decision if decision.result == "restart" else self._end(decision)
