"""Checkpoint commit, prune and the two uploaders, run on simulated nodes and storage.

- `checkpoint-commit`: every node of a job saves versioned checkpoints into its node-local
  tier (amlhpc.jobs.runtime.checkpoint.tier, markers and all) in step, each a little late or
  early (a synchronous training: no step completes while a node is frozen); each node's
  VersionUploader (node 0 leads, the others follow, the books of a commit on the job's store
  that node 0 hosts, amlhpc.sim.store) runs its rounds on virtual time, as its `_loop` would. Faults drawn from the seed: lost replies and lost
  requests on every write of the commit path (pending records, parts, the manifest, the
  `latest` pointer), 503 storms on the pointer, slow requests, a node partitioned from
  storage, frozen or killed at a checkpoint fault point (then only the safety invariants apply),
  a follower whose last save fails (it never holds the last version node 0 leads). The parts
  are striped over 1 to 3 storage accounts (the job's checkpoint accounts, store.py).
- `folder-upload`: one node's FolderUploader uploads its checkpoint folder as versions
  (store.upload: commit, then prune) while the training rewrites it; the same faults.
- `prune-race`: a folder uploader and `python -m amlhpc.jobs.runtime.checkpoint prune` by
  hand (store.prune on its own process) on one stream, at seeded times, with slow requests;
  the parts striped over 1 to 3 accounts, so retention deletes in each.

Invariants (an oracle reads the service's state every virtual second, never through requests):
- `pointer-orphan`: `latest` names a manifest that does not exist (a restore fails);
- `part-missing`: a part of the version `latest` names is gone, or not what its manifest says;
- `committed-deleted`: a manifest among the newest `keep` committed ones was deleted;
- `commits-stuck`: the training stops saving after `train_s`; the run goes on until `latest`
  names the last version every node saved, for at most `settle_s` more (long enough for every
  retry budget and backoff the faults can cause): if it does not by then, the uploaders stopped moving.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from amlhpc.jobs.runtime.checkpoint import tier
from amlhpc.jobs.runtime.checkpoint.sequence import sequence_of
from amlhpc.jobs.runtime.checkpoint.store import CheckpointStore
from amlhpc.jobs.runtime.checkpoint.uploader import FolderUploader, VersionUploader
from amlhpc.jobs.runtime.coord.agree import Channel
from amlhpc.jobs.runtime.coord.kvstore import StoreLost
from amlhpc.sim.faults import FaultPlan, PointFault, RequestFault
from amlhpc.sim.scenario import Scenario, Violation
from amlhpc.sim.world import ACCOUNT, World

CONTAINER = "checkpoints"
PREFIX = "exp/run"
STRIPE_ACCOUNTS = (ACCOUNT, "simstripe1", "simstripe2")
"""The accounts a job's checkpoint parts are striped over (the first `accounts` of them)."""
SETTLE_S = 400.0
"""After the training's last save: longer than any retry budget (RetrySettings: 8 status retries,
backoffs up to 30 s) and fault the plans draw, so a version not committed by then never will be."""


@dataclass
class StreamOracle:
    """Checks a stream's invariants from the service's own state (see the module docstring)."""

    world: World
    stream: str
    keep: int
    committed: list[str] = field(default_factory=list)
    """Versions `latest` was seen naming, in order."""
    found: dict[str, Violation] = field(default_factory=dict)

    def _blobs(self, account: str = ACCOUNT) -> dict:
        return self.world.blob.accounts[account].containers[CONTAINER].blobs

    def _json(self, name: str) -> dict | None:
        blob = self._blobs().get(name)
        if blob is None or not blob.committed:
            return None
        try:
            document = json.loads(blob.data)
        except ValueError:
            return None
        return document if isinstance(document, dict) else None

    def _say(self, kind: str, detail: str) -> None:
        if kind not in self.found:
            self.found[kind] = Violation(kind, f"at {self.world.now:.1f}s: {detail}")

    def look(self) -> None:
        pointer = self._json(f"{self.stream}/latest")
        if pointer is None:
            return
        version = str(pointer.get("version"))
        if not self.committed or self.committed[-1] != version:
            self.committed.append(version)
        manifest = self._json(f"{self.stream}/manifests/{version}.json")
        if manifest is None:
            self._say("pointer-orphan", f"`latest` names {version}, whose manifest does not exist: every restore fails")
        else:
            for entry in manifest.get("files", []):
                blob = self._blobs(entry.get("account") or ACCOUNT).get(entry["blob"])  # striped: its own account
                if blob is None or not blob.committed or blob.size != entry["size"] or \
                        blob.metadata.get("amlhpc_sha256") != entry["sha256"]:
                    self._say("part-missing", f"{entry['blob']} of {version} (named by `latest`) is gone or changed")
                    break
        for kept in self.committed[-self.keep:]:
            if self._json(f"{self.stream}/manifests/{kept}.json") is None and kept != version:
                self._say("committed-deleted", f"the manifest of {kept}, one of the newest {self.keep} committed "
                                               "versions, was deleted")

    def pointer_step(self) -> int:
        pointer = self._json(f"{self.stream}/latest")
        return sequence_of(pointer["version"]) if pointer else -1

    def watch(self, every_s: float = 1.0) -> None:
        """Look every `every_s`, and at once after every write of the pointer (so every version
        `latest` ever named is in `committed`, however fast the commits follow each other)."""
        pointer = f"{self.stream}/latest"

        def written(op: str, container: str, blob: str) -> None:
            if container == CONTAINER and blob == pointer and op in ("put_blob", "put_block_list"):
                self.look()
        self.world.blob.watchers.append(written)

        def loop() -> None:
            while True:
                self.look()
                self.world.sim.sleep(every_s)
        self.world.spawn(f"oracle-{self.stream}", loop)


def striped_store(world: World, stream: str, accounts: int, **kwargs) -> CheckpointStore:
    """A stream whose parts are striped over the first `accounts` of STRIPE_ACCOUNTS (1: unstriped)."""
    stripes = [(name, world.container(CONTAINER, account=name)) for name in STRIPE_ACCOUNTS[:accounts]]
    return CheckpointStore(world.container(CONTAINER), stream, stripes=stripes if accounts > 1 else (), **kwargs)


def save_version(checkpoint_dir: Path, rank: int, step: int, world_size: int, tag: str, size: int = 64) -> None:
    """What a rank's Checkpointer leaves in the tier: its part's files, then its marker."""
    version_dir = tier.versions_dir(checkpoint_dir) / tier.version_name(step)
    folder = tier.rank_dir(version_dir, rank)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "shard.bin").write_bytes(f"{rank}:{step}:".encode() * (size // 8))
    tier.write_marker(version_dir, rank, step=step, world=world_size, tag=tag)


def _commit_faults(rng: random.Random, nodes: list[str]) -> FaultPlan:
    plan = FaultPlan()
    for _ in range(rng.choice([0, 1, 1, 2, 2, 3])):
        kind = rng.choice(["lost-reply", "lost-reply", "lost-request", "busy", "delay", "partition", "freeze", "kill"])
        target = rng.choice(["latest", "manifests/*", "pending/*", "data/*"])
        op = "put_block_list" if target == "data/*" else "put_blob"
        if kind == "busy":
            plan.add(RequestFault("busy", blob=f"{CONTAINER}/{PREFIX}*/latest", nth=rng.randint(1, 40),
                                  duration_s=rng.uniform(2.0, 90.0)))
        elif kind == "delay":
            plan.add(RequestFault("delay", op=op, blob=f"{CONTAINER}/{PREFIX}*/{target}", nth=rng.randint(1, 6),
                                  delay_s=rng.uniform(0.5, 8.0)))
        elif kind == "partition":
            plan.add(RequestFault("partition", node=rng.choice(nodes), nth=rng.randint(5, 60),
                                  duration_s=rng.uniform(5.0, 30.0)))
        elif kind == "kill":
            plan.add(PointFault("kill", rng.choice(["checkpoint.pending-written", "checkpoint.block-staged",
                                                    "checkpoint.part-committed", "checkpoint.verified",
                                                    "checkpoint.manifest-written", "checkpoint.pointer-written",
                                                    "checkpoint.prune-decided"]),
                                node=rng.choice(nodes), nth=rng.randint(1, 3)))
        elif kind == "freeze":
            plan.add(PointFault("freeze", rng.choice(["checkpoint.pending-written", "checkpoint.verified",
                                                      "checkpoint.manifest-written", "checkpoint.parts-recorded"]),
                                node=rng.choice(nodes), nth=rng.randint(1, 3), duration_s=rng.uniform(2.0, 20.0)))
        else:
            plan.add(RequestFault(kind, op=op, blob=f"{CONTAINER}/{PREFIX}*/{target}", nth=rng.randint(1, 6),
                                  reset_s=rng.choice([None, 0.05, 1.0])))
    return plan


class CheckpointCommit(Scenario):
    name = "checkpoint-commit"
    summary = "every node's VersionUploader commits versioned checkpoints; faults on every write of the commit path"
    duration_s = 60.0
    """How long the training saves; the run then settles (see `commits-stuck`)."""

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        nodes = size or rng.randint(2, 4)
        self.settings = {"nodes": nodes, "save_s": rng.choice([6.0, 8.0, 10.0]), "interval_s": rng.choice([3.0, 5.0]),
                         "keep": rng.choice([1, 2, 3]), "skew_s": rng.uniform(0.0, 4.0), "settle_s": SETTLE_S}
        plan = _commit_faults(rng, [f"node-{k}" for k in range(nodes)])
        # Drawn after the faults (their draws stay what they were): a follower whose last save fails.
        self.settings["short_node"] = rng.randrange(1, nodes) if rng.random() < 0.25 else None
        self.settings["accounts"] = rng.randint(1, 3)  # drawn last, for the same reason
        return plan

    def start(self, world: World, root: Path) -> None:
        s = self.settings
        nodes: int = s["nodes"]
        world.container(CONTAINER)
        stream = f"{PREFIX}/versions"
        self.oracle = StreamOracle(world, stream, s["keep"])
        self.oracle.watch()
        self.held: dict[int, float] = {}
        """step -> when every node held it."""
        self._holders: dict[int, set[int]] = {}
        self._steps: dict[int, int | None] = {}
        """The training's beat (every save_s) -> the step it completed, None while a node was frozen or gone."""
        self.uploaders: list[VersionUploader] = []
        self.trainers: list = []
        hosts = [world.node(f"node-{k}") for k in range(nodes)]
        self.jobstore = world.jobstore(hosts[0])
        for k, node in enumerate(hosts):
            checkpoint_dir = root / node.name
            store = striped_store(world, stream, s["accounts"], node=k, workers=2, blocks_in_flight=2)
            channel = Channel(self.jobstore.client(), node=k, nodes=nodes, rng=random.Random(f"{world.seed}:{k}"))
            uploader = VersionUploader(store, checkpoint_dir, [k], k, nodes, s["interval_s"], s["keep"], local_keep=2,
                                       channel=channel.scoped("ckpt", "u0"))
            self.uploaders.append(uploader)
            self.trainers.append(world.spawn(f"train-{k}", self._trainer(world, checkpoint_dir, k, nodes), node=node))
            world.spawn(f"upload-{k}", self._uploader(world, uploader), node=node)

    def _trainer(self, world: World, checkpoint_dir: Path, rank: int, nodes: int):
        s = self.settings
        rng = random.Random(f"train:{world.seed}:{rank}")
        tag = tier.timeline_tag("run", 0)

        def train() -> None:
            # A synchronous training: the ranks' collectives end every step together (every
            # `save_s`), and no step completes while a node is frozen or gone (decided once per
            # step, for every rank: a node thawed late does not count the steps it slept through);
            # each rank saves it a little later than the others or earlier (up to `skew_s`).
            beat, boundary = 0, world.now
            while boundary + s["save_s"] < self.duration_s:
                boundary += s["save_s"]
                beat += 1
                world.sim.sleep(max(0.0, boundary - world.now))
                if beat not in self._steps:
                    stalled = any(peer.frozen or peer.dead for peer in world.sim.nodes)
                    self._steps[beat] = None if stalled else 100 * (1 + sum(v is not None for v in self._steps.values()))
                step = self._steps[beat]
                if step is None:
                    continue
                world.sim.sleep(rng.uniform(0.0, s["skew_s"]))
                if rank == s.get("short_node") and boundary + s["save_s"] >= self.duration_s:
                    continue  # this node's last save fails (a full disk): it never holds the last version
                save_version(checkpoint_dir, rank, step, nodes, tag)
                done = self._holders.setdefault(step, set())
                done.add(rank)
                if len(done) == nodes:
                    self.held[step] = world.now
        return train

    @staticmethod
    def _uploader(world: World, uploader: VersionUploader):
        def loop() -> None:
            # VersionUploader.start and _loop, with the loop's wait on virtual time.
            uploader.store.take_over()
            try:
                if uploader.node == 0:
                    uploader._announce(lead=None, committed=None)
                next_lead = world.now + uploader.interval_s
                while True:
                    world.sim.sleep(uploader.poll_s)
                    due = world.now >= next_lead
                    if due:
                        next_lead = world.now + uploader.interval_s
                    uploader._step(due)
            except StoreLost as exc:
                uploader.errors.append(str(exc))
        return loop

    def finish(self, world: World) -> None:
        world.sim.run_until(lambda: all(t.finished for t in self.trainers), limit_s=2 * self.duration_s)
        last = max(self.held, default=-1)
        world.sim.run_until(lambda: self.oracle.pointer_step() >= last, limit_s=self.settings["settle_s"])

    def check(self, world: World) -> list[Violation]:
        self.oracle.look()
        found = list(self.oracle.found.values())
        killed = any(n.dead or n.frozen for n in world.sim.nodes)
        last = max(self.held, default=-1)
        latest = self.oracle.pointer_step()
        self.metrics = {"latest": latest, "saved": last, "errors": sum(len(u.errors) for u in self.uploaders),
                        "committed": len(self.oracle.committed), "settled_at": round(world.now, 1)}
        if last >= 0 and not killed and latest < last:
            errors = [e for u in self.uploaders for e in u.errors]
            found.append(Violation("commits-stuck", f"`latest` is at step {latest} {self.settings['settle_s']:.0f}s after every node "
                                                    f"held step {last} (at {self.held[last]:.0f}s); the uploaders' "
                                                    f"last error: {errors[-1] if errors else 'none'}"))
        return found


class FolderUpload(Scenario):
    name = "folder-upload"
    summary = "one node's FolderUploader uploads its checkpoint folder as versions while training rewrites it"
    duration_s = 50.0
    """How long the training saves; the run then settles."""

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        self.settings = {"save_s": rng.choice([4.0, 6.0]), "interval_s": rng.choice([3.0, 5.0]),
                         "keep": rng.choice([1, 2, 3]), "settle_s": SETTLE_S}
        return _commit_faults(rng, ["node-0"])

    def start(self, world: World, root: Path) -> None:
        s = self.settings
        node = world.node("node-0")
        folder = root / "ckpt"
        folder.mkdir()
        store = CheckpointStore(world.container(CONTAINER), PREFIX, node=0, workers=2, blocks_in_flight=2)
        self.uploader = FolderUploader(store, folder, s["interval_s"], s["keep"], settle_s=0.0)
        self.oracle = StreamOracle(world, PREFIX, s["keep"])
        self.oracle.watch()
        self.saved: list[tuple[float, int]] = []

        def train() -> None:
            step = 0
            while world.now + s["save_s"] < self.duration_s:
                world.sim.sleep(s["save_s"])
                step += 1
                (folder / "model.pt").write_bytes(b"weights-%d" % step * 8)
                (folder / "step.json").write_text(json.dumps({"step": step}))
                self.saved.append((world.now, step))

        def upload() -> None:
            while True:
                world.sim.sleep(s["interval_s"])
                self.uploader.upload_once()
        self.trainer = world.spawn("train", train, node=node)
        world.spawn("upload", upload, node=node)

    def _uploaded_step(self) -> int:
        pointer = self.oracle._json(f"{PREFIX}/latest")
        manifest = self.oracle._json(f"{PREFIX}/manifests/{pointer['version']}.json") if pointer else None
        for entry in (manifest or {}).get("files", []):
            blob = self.oracle._blobs().get(entry["blob"]) if entry["path"] == "step.json" else None
            if blob is not None:
                return int(json.loads(blob.data)["step"])
        return -1

    def finish(self, world: World) -> None:
        world.sim.run_until(lambda: self.trainer.finished, limit_s=2 * self.duration_s)
        last = self.saved[-1][1] if self.saved else -1
        world.sim.run_until(lambda: self._uploaded_step() >= last, limit_s=self.settings["settle_s"])

    def check(self, world: World) -> list[Violation]:
        self.oracle.look()
        found = list(self.oracle.found.values())
        uploaded = self._uploaded_step()
        last = self.saved[-1][1] if self.saved else -1
        frozen = any(n.dead or n.frozen for n in world.sim.nodes)
        self.metrics = {"uploaded_step": uploaded, "saved": last, "errors": len(self.uploader.errors),
                        "settled_at": round(world.now, 1)}
        if last >= 0 and not frozen and uploaded < last:
            error = self.uploader.errors[-1] if self.uploader.errors else "none"
            found.append(Violation("commits-stuck", f"the newest committed folder holds step {uploaded} "
                                                    f"{self.settings['settle_s']:.0f}s after step {last} was saved; the uploader's "
                                                    f"last error: {error}"))
        return found


class PruneRace(Scenario):
    name = "prune-race"
    summary = "a folder uploader and a prune by hand on one stream, at seeded times, with slow requests"
    duration_s = 90.0

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        self.settings = {"interval_s": rng.choice([2.0, 3.0]), "keep": rng.choice([1, 2]),
                         "prunes": rng.randint(3, 10), "prune_start_s": rng.uniform(2.0, 20.0),
                         "prune_every_s": rng.uniform(1.0, 8.0)}
        plan = FaultPlan()
        for _ in range(rng.randint(0, 3)):
            plan.add(RequestFault("delay", node="prune", nth=rng.randint(1, 60), delay_s=rng.uniform(0.2, 4.0)))
        self.settings["accounts"] = rng.randint(1, 3)
        return plan

    def start(self, world: World, root: Path) -> None:
        s = self.settings
        uploader_node, pruner = world.node("node-0"), world.node("prune", principal="operator")
        folder = root / "ckpt"
        folder.mkdir()
        store = striped_store(world, PREFIX, s["accounts"], node=0, workers=2, blocks_in_flight=2)
        self.uploader = FolderUploader(store, folder, s["interval_s"], s["keep"], settle_s=0.0)
        self.oracle = StreamOracle(world, PREFIX, s["keep"])
        self.oracle.watch(every_s=0.25)
        self.prune_errors: list[str] = []

        def upload() -> None:
            step = 0
            while True:
                step += 1
                (folder / "model.pt").write_bytes(b"weights-%d" % step * 8)
                (folder / "optim.pt").write_bytes(b"moments-%d" % step * 6)  # striped: in another account
                self.uploader.upload_once()
                world.sim.sleep(s["interval_s"])

        def prune() -> None:
            by_hand = striped_store(world, PREFIX, s["accounts"], node=0)
            world.sim.sleep(s["prune_start_s"])
            for _ in range(s["prunes"]):
                try:
                    by_hand.prune(s["keep"])
                except Exception as exc:  # noqa: BLE001 - the command reports it; the invariants judge the stream
                    self.prune_errors.append(f"{type(exc).__name__}: {exc}")
                world.sim.sleep(s["prune_every_s"])
        world.spawn("upload", upload, node=uploader_node)
        world.spawn("prune", prune, node=pruner)

    def check(self, world: World) -> list[Violation]:
        self.oracle.look()
        self.metrics = {"committed": len(self.oracle.committed), "upload_errors": len(self.uploader.errors),
                        "prune_errors": len(self.prune_errors)}
        return list(self.oracle.found.values())
