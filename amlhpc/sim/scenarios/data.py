"""Datasets: staging's listing, assignment and fetches, and `jobs data upload` sessions.

- `staging`: a dataset is uploaded as a version (amlhpc.jobs.data.versions.upload_version:
  gzip members, checksums, conditional commits, the manifest last); the nodes of a job stage
  its latest committed version in `local` mode (amlhpc.jobs.runtime.staging.stager.stage_inputs
  on staging's stdlib reader, each node its share by the byte-balanced assignment, agreeing on
  the manifest through the job's store) while a new version is uploaded at a seeded moment
  (every file changed, one added, one dropped); the manifest inline or in parts of 2 or 5
  files. Faults: slow requests, 503 storms, lost replies on the readers' GETs and on one
  write of a manifest or a part.
- `upload-sessions`: two uploads of different local folders to one prefix overlap (two
  people, two machines), with lost replies and lost requests on their commits.

Invariants:
- `mixed-dataset`: every node staged without error, and the files they hold together are not
  exactly one version of the dataset (a file set and contents that one upload produced);
- `mixed-blob`: a committed blob's bytes are not its recorded checksums', or not the content
  of the session its metadata names;
- `both-won`: both sessions reported a file uploaded, and the one whose content the blob
  holds committed it without having seen the other's (its commit's condition does not name
  the other's ETag): one of them was overwritten unknowingly.
The metrics count what a lost reply costs an upload: `self_conflicts`, files a session
reported as lost to another writer whose blob holds its own content (its retried commit met
its own first one).
"""

from __future__ import annotations

import gzip
import hashlib
import random
from pathlib import Path

from amlhpc.jobs.data.upload import UploadError, upload_directory
from amlhpc.jobs.data.versions import upload_version
from amlhpc.jobs.runtime.base.ranks import Ranks
from amlhpc.jobs.runtime.blob.blobio import RetrySettings
from amlhpc.jobs.runtime.coord.agree import Channel
from amlhpc.jobs.runtime.staging.stager import StageOptions, stage_inputs
from amlhpc.jobs.runtime.staging.stagespec import StageSpec
from amlhpc.sim.faults import FaultPlan, RequestFault
from amlhpc.sim.scenario import Scenario, Violation
from amlhpc.sim.world import ACCOUNT, World

DATASETS = "datasets"
PREFIX = "cosmo"


def _write_folder(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _version(rng: random.Random, tag: str, names: list[str]) -> dict[str, bytes]:
    return {name: f"{tag}:{name}:".encode() * rng.randint(4, 400) for name in names}


def _stored(world: World, name: str) -> tuple[bytes, dict[str, str], list] | None:
    blob = world.blob.accounts[ACCOUNT].containers[DATASETS].blobs.get(name)
    if blob is None or not blob.committed:
        return None
    data = gzip.decompress(blob.data) if blob.content.get("content_encoding") == "gzip" else blob.data
    return data, dict(blob.metadata), list(blob.writes)


class Staging(Scenario):
    name = "staging"
    summary = "nodes stage a dataset while a new version of it is uploaded over it"
    duration_s = 600.0

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        nodes = size or rng.randint(2, 4)
        files = rng.randint(6, 24)
        names = [f"part-{i:03d}.rec" for i in range(files)]
        self.settings = {"nodes": nodes, "files": files, "update_at_s": rng.choice([rng.uniform(0.0, 0.3),
                                                                                  rng.uniform(0.0, 3.0)]),
                         "update": rng.random() < 0.8, "node_start_s": [rng.uniform(0.0, 1.0) for _ in range(nodes)]}
        self.first = _version(rng, "v1", names)
        self.second = _version(rng, "v2", names[1:] + ["part-999.rec"])
        plan = FaultPlan()
        for _ in range(rng.choice([0, 1, 1, 2])):
            kind = rng.choice(["delay", "busy", "lost-reply"])
            node = f"node-{rng.randrange(nodes)}"
            if kind == "delay":
                plan.add(RequestFault("delay", node=node, nth=rng.randint(1, 20), delay_s=rng.uniform(0.2, 3.0)))
            elif kind == "busy":
                plan.add(RequestFault("busy", op="get_blob", node=node, nth=rng.randint(1, 20),
                                      duration_s=rng.uniform(1.0, 20.0)))
            else:
                plan.add(RequestFault("lost-reply", op="get_blob", node=node, nth=rng.randint(1, 20), reset_s=0.05))
        # Drawn last, so the seeds drawn before keep their runs: the manifest in parts of 2 or 5
        # files (each node reads its share's), the reply to one write of a part or a manifest lost.
        self.settings["part_rows"] = rng.choice([None, 2, 5])
        if self.settings["part_rows"] and rng.random() < 0.5:
            plan.add(RequestFault("lost-reply", op="put_blob", blob=f"{DATASETS}/{PREFIX}/_[pv]*/*.json",
                                  node="uploader", nth=rng.randint(1, 6), reset_s=0.05))
        return plan

    def start(self, world: World, root: Path) -> None:
        s = self.settings
        container = world.container(DATASETS)
        first, second = root / "v1", root / "v2"
        _write_folder(first, self.first)
        _write_folder(second, self.second)
        uploader = world.node("uploader", principal="data-contributor")
        world.call(lambda: upload_version(container, first, PREFIX, workers=2, part_rows=s["part_rows"]), node=uploader)
        self.results: dict[int, object] = {}
        spec = StageSpec(name="cosmo", container=DATASETS, prefix=PREFIX)
        options = StageOptions(concurrency=4, file_workers=2, inflate_workers=1, timeout_s=3600.0,
                               retry=RetrySettings(), report_dir=root / "reports")
        nodes = [world.node(f"node-{k}") for k in range(s["nodes"])]
        jobstore = world.jobstore(nodes[0])
        for k, node in enumerate(nodes):
            channel = Channel(jobstore.client(), node=k, nodes=s["nodes"], rng=random.Random(f"{world.seed}:{k}"))
            ranks = Ranks(rank=k, local_rank=0, world_size=s["nodes"], local_size=1, source="torch", run_id="sim")
            env = {"AMLHPC_LAUNCH_ID": f"launch-{k}", "AZUREML_RUN_ID": "sim-staging"}
            scratch = root / node.name / "scratch"
            scratch.mkdir(parents=True)

            def stage(k: int = k, ranks: Ranks = ranks, env: dict = env, scratch: Path = scratch,
                      channel: Channel = channel) -> None:
                world.sim.sleep(s["node_start_s"][k])
                try:
                    self.results[k] = stage_inputs([spec], ranks, scratch, env=env, options=options,
                                                   reader_factory=lambda _spec: world.reader(DATASETS), channel=channel)
                except Exception as exc:  # noqa: BLE001 - a node that fails staging ends the job: judged below
                    self.results[k] = exc
            world.spawn(f"stage-{k}", stage, node=node)
        if s["update"]:
            def update() -> None:
                world.sim.sleep(s["update_at_s"])
                try:
                    upload_version(world.container(DATASETS), second, PREFIX, workers=2, part_rows=s["part_rows"])
                except UploadError:
                    pass
            world.spawn("update", update, node=uploader)
        self.root = root

    def finish(self, world: World) -> None:
        world.sim.run_until(lambda: len(self.results) == self.settings["nodes"], limit_s=self.duration_s)

    def check(self, world: World) -> list[Violation]:
        failed = {k: r for k, r in self.results.items() if isinstance(r, BaseException)}
        self.metrics = {"failed_nodes": len(failed), "first_error": str(next(iter(failed.values())))[:160]
                        if failed else None,
                        "versions": sorted({item.version for r in self.results.values() if not isinstance(r, BaseException)
                                            for item in r.inputs})}  # type: ignore[attr-defined]
        if failed or len(self.results) < self.settings["nodes"]:
            return []  # the job does not start: no result to judge
        staged: dict[str, bytes] = {}
        for result in self.results.values():
            for item in result.inputs:  # type: ignore[attr-defined]
                data_dir = Path(item.data_dir)
                for path in sorted(p for p in data_dir.rglob("*") if p.is_file()):
                    staged[path.relative_to(data_dir).as_posix()] = path.read_bytes()
        versions = {"v1": self.first, "v2": self.second}
        matches = [tag for tag, files in versions.items() if files == staged]
        if matches:
            return []
        origin = {rel: next((tag for tag, files in versions.items() if files.get(rel) == data), "neither")
                  for rel, data in staged.items()}
        summary = ", ".join(f"{tag}: {sum(1 for v in origin.values() if v == tag)}" for tag in ("v1", "v2", "neither"))
        missing = sorted(set(self.first) - set(staged)) if origin and all(v == "v1" for v in origin.values()) else []
        return [Violation("mixed-dataset", f"the nodes staged {len(staged)} files that are no one version of the "
                                           f"dataset ({summary}{'; missing ' + ', '.join(missing[:3]) if missing else ''})")]


class UploadSessions(Scenario):
    name = "upload-sessions"
    summary = "two `jobs data upload` sessions of different folders to one prefix overlap, with lost replies"
    duration_s = 600.0

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        files = size or rng.randint(3, 10)
        names = [f"f{i:02d}.bin" for i in range(files)]
        self.settings = {"files": files, "second_at_s": rng.choice([0.0, rng.uniform(0.0, 0.05), rng.uniform(0.0, 0.5)])}
        self.contents = {"a": _version(rng, "a", names), "b": _version(rng, "b", names)}
        plan = FaultPlan()
        for _ in range(rng.choice([0, 1, 2])):
            kind = rng.choice(["lost-reply", "lost-request", "delay"])
            who = rng.choice(["uploader-a", "uploader-b"])
            op = rng.choice(["put_blob", "put_blob", "put_block_list", "put_block"])
            if kind == "delay":
                plan.add(RequestFault("delay", node=who, nth=rng.randint(1, files), delay_s=rng.uniform(0.1, 2.0)))
            else:
                plan.add(RequestFault(kind, op=op, node=who, nth=rng.randint(1, files), reset_s=rng.choice([0.05, None])))
        return plan

    def start(self, world: World, root: Path) -> None:
        world.container(DATASETS)
        self.reports: dict[str, tuple[set[str], set[str], str]] = {}
        for who, delay in (("a", 0.0), ("b", self.settings["second_at_s"])):
            folder = root / who
            _write_folder(folder, self.contents[who])
            node = world.node(f"uploader-{who}", principal=f"person-{who}")

            def upload(who: str = who, folder: Path = folder, delay: float = delay) -> None:
                world.sim.sleep(delay)
                try:
                    report = upload_directory(world.container(DATASETS), folder, PREFIX, workers=2)
                    failed: set[str] = set()
                except UploadError as exc:
                    report = exc.report  # type: ignore[assignment]
                    failed = {f.split(":", 1)[0] for f in (report.failures if report else [])}
                conflicts = set(report.conflicts) if report else set()
                self.reports[who] = (set(self.contents[who]) - failed - conflicts, conflicts, report.session if report else "")
            world.spawn(f"upload-{who}", upload, node=node)

    def finish(self, world: World) -> None:
        world.sim.run_until(lambda: len(self.reports) == 2, limit_s=self.duration_s)

    def check(self, world: World) -> list[Violation]:
        found: list[Violation] = []
        self_conflicts = 0
        sessions = {report[2]: who for who, report in self.reports.items()}
        for rel in sorted(self.contents["a"]):
            stored = _stored(world, f"{PREFIX}/{rel}.gz")
            if stored is None:
                continue
            data, metadata, writes = stored
            holder = next((who for who in ("a", "b") if self.contents[who][rel] == data), None)
            named = sessions.get(metadata.get("amlhpc_upload_id", ""))
            if hashlib.sha256(data).hexdigest() != metadata.get("amlhpc_sha256") or holder is None or named != holder:
                found.append(Violation("mixed-blob", f"{rel}: its bytes are {holder or 'nobody'}'s, its checksums and "
                                                     f"session name {named or 'nobody'}"))
            won = [who for who, report in self.reports.items() if rel in report[0]]
            if len(won) == 2 and len(writes) >= 2:
                _, _, if_match, _ = writes[-1]
                if if_match is None or if_match.strip('"') != writes[-2][1].strip('"'):
                    found.append(Violation("both-won", f"{rel}: both sessions reported it uploaded; the blob holds "
                                                       f"{holder}'s, committed without seeing the other's"))
            self_conflicts += sum(1 for who, report in self.reports.items() if rel in report[1] and holder == who)
        self.metrics = {"self_conflicts": self_conflicts,
                        "uploaded": {who: len(report[0]) for who, report in self.reports.items()}}
        return found[:3]
