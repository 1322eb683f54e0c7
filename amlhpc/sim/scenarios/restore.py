"""Which checkpoint a managed run's next attempt restores while other jobs write the container.

`restore-pin`: attempt 1 of a managed run (its evidence key derived from the run's secret, as
the controller hands it over) uploads its checkpoint folder as versions every `interval_s`
(CheckpointStore.upload: the commit signs `latest`). The run's controller looks at the pointer
every `look_s` as its supervision loop does (Supervisor._note_commit) and, once attempt 1 has
ended, claims attempt 2 with the pins its claim computes (Evidence.checked over the record's
bounds -> AMLHPC_RESTORE_PIN). Attempt 2 restores as the launcher does (RestoreTrust from its
environment, CheckpointStore.latest, restore), commits versions of its own, then restores again
as an in-job restart does. Meanwhile another job, which like every job may write the
container, at seeded times: points `latest` at a version of its own (unsigned, or signed with
its own attempt's key), writes back a pointer attempt 1 committed earlier (a replay), or
rewrites the manifest `latest` names. Faults: lost replies and delays on the run's pointer and
manifest writes, a 503 storm on the pointer; and at a named step of an attempt's commit
(amlhpc.jobs.runtime.base.faultpoints, `checkpoint.*`): its process killed there (a host lost,
or a cancel's SIGKILL: to Blob the two are the same, the commit stops at that step), frozen
there for a while (a cancel's grace, a stopped process), or its wall clock stepped (back or
forward, as an NTP correction does). Attempt 1 killed ends it (the controller then claims
attempt 2); attempt 2 killed is restarted in the job (its launcher restores again, as an in-job
restart does), and its restart's restore is the one the invariants judge.

Invariants (checked on what each restore returned and wrote, and on the commits):
- `restored-foreign`: a restore took a version no attempt of the run uploaded;
- `restored-rewritten`: a restored file is not what the run committed in that version;
- `restored-stale`: attempt 2 first restored a version older than the newest its controller
  saw committed before the claim (a replayed pointer believed);
- `restore-lost`: attempt 2 restored nothing though its controller had seen a version
  committed, and the other job neither rewrote that version's manifest (a refusal is right
  then) nor wrote the pointer. Availability under pointer writes is not promised: a job that
  overwrites `latest` right after each commit hides the commits from the controller's looks,
  the claim then pins the last version it saw, and retention may have dropped that one (any
  job may delete a run's checkpoints outright: docs/security.md). What is promised is that
  nothing the run did not write is restored;
- `restart-went-back`: attempt 2's restart restored a version older than its own last commit,
  or nothing though nobody rewrote that commit's manifest, unless the other job wrote the
  pointer after that commit (the same availability caveat as `restore-lost`: the restart
  follows only a pointer its attempt signed, else the pin, so a foreign or replayed pointer
  hides the attempt's later commits; it restores the pin, the run's own, never the other's);
- `seen-deleted`: a version the controller saw committed is deleted while fewer than `keep`
  newer versions are left (only retention may drop it, and only then; the other job's
  versions count, as retention counts them);
- `commit-refused`: a commit of the run failed with no write of the other job since that
  attempt's previous commit: a write it makes while a commit runs may cost that commit (the
  pointer moved under it), never a later one.
"""

from __future__ import annotations

import hashlib
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from amlhpc.jobs.managed.evidence import Evidence
from amlhpc.jobs.managed.record import Attempt, Record
from amlhpc.jobs.managed.supervisor import Supervisor, _pointer_bounds
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError
from amlhpc.jobs.runtime.checkpoint.sequence import sequence_of
from amlhpc.jobs.runtime.checkpoint.snapshot import scan
from amlhpc.jobs.runtime.checkpoint.store import SCHEMA, CheckpointStore, Manifest
from amlhpc.jobs.runtime.checkpoint.trust import (
    MANIFEST_DIGEST,
    RestoreTrust,
    pins_document,
    pins_json,
)
from amlhpc.jobs.runtime.coord import nodestatus
from amlhpc.sim.faults import FaultPlan, PointFault, RequestFault
from amlhpc.sim.scenario import Scenario, Violation
from amlhpc.sim.world import ACCOUNT, World

CONTAINER = "checkpoints"
PREFIX = "exp/run-7"
RUN = "run-7"
SECRET = "5e" * 32
"""The run's secret (in the controller's job definition): the attempts' keys derive from it."""
OTHER_SECRET = "7a" * 32
"""Another run's: what the other job signs with."""
ATTACKS = ("foreign-unsigned", "foreign-signed", "replay", "rewrite-manifest")
KEEP = 3
"""Versions the run's uploads keep (retention)."""
COMMIT_STEPS = ("checkpoint.pending-written", "checkpoint.block-staged", "checkpoint.part-committed",
                "checkpoint.verified", "checkpoint.manifest-written", "checkpoint.pointer-written",
                "checkpoint.prune-decided")
"""The steps of one versioned upload where an attempt's process is killed, frozen or its clock stepped."""


def _attempt(number: int) -> str:
    return f"{RUN}-attempt-{number}"


def _environ(job: str, pins: dict[str, Any] | None = None) -> dict[str, str]:
    """What the controller puts in an attempt's job: its id, its evidence key, its pins."""
    env = {"AZUREML_RUN_ID": job, contract.EVIDENCE_KEY: nodestatus.attempt_key(SECRET, job)}
    if pins is not None:
        env[contract.RESTORE_PIN] = pins_json(pins)
    return env


def _order(version: str) -> tuple[int, str]:
    return sequence_of(version), version


def _digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


class RestorePin(Scenario):
    name = "restore-pin"
    summary = ("attempts of a managed run commit signed checkpoint pointers while another job forges, replays "
               "and rewrites them; the controller pins at its claim; every restore takes only what the run committed")
    duration_s = 200.0

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        s: dict[str, Any] = {"versions": rng.randint(2, 4), "interval_s": rng.choice([8.0, 12.0, 20.0]),
             "look_s": rng.choice([3.0, 5.0, 10.0]), "claim_after_s": rng.uniform(0.0, 30.0),
             "own_versions": rng.randint(1, 2)}
        # at any time of the run's life: during attempt 1, between it and the claim, during attempt 2
        life = (s["versions"] + s["own_versions"]) * s["interval_s"] + s["claim_after_s"]
        attacks = [(rng.choice(ATTACKS), rng.uniform(1.0, life)) for _ in range(rng.choice([1, 2, 2, 3]))]
        s["attacks"] = [(kind, round(at, 1)) for kind, at in sorted(attacks, key=lambda a: a[1])]
        self.settings = s
        plan = FaultPlan()
        for _ in range(rng.choice([0, 1, 1, 2])):
            kind = rng.choice(["lost-reply", "lost-reply", "delay", "busy"])
            target = rng.choice(["latest", "manifests/*"])
            if kind == "busy":
                plan.add(RequestFault("busy", blob=f"{CONTAINER}/{PREFIX}/latest", nth=rng.randint(1, 20),
                                      duration_s=rng.uniform(2.0, 30.0)))
            elif kind == "delay":
                plan.add(RequestFault("delay", op="put_blob", blob=f"{CONTAINER}/{PREFIX}/{target}",
                                      nth=rng.randint(1, 4), delay_s=rng.uniform(0.5, 6.0)))
            else:
                plan.add(RequestFault(kind, op="put_blob", blob=f"{CONTAINER}/{PREFIX}/{target}",
                                      nth=rng.randint(1, 4), reset_s=rng.choice([None, 0.05])))
        # Drawn last, from a generator of their own, so a seed's earlier draws (and the runs
        # amlhpc.sim.known keeps) stay what they were.
        process = random.Random(rng.random())
        for _ in range(process.choice([0, 0, 1, 1, 2])):
            kind, node = process.choice(["kill", "kill", "freeze", "clock-step"]), process.choice(["attempt-1", "attempt-2"])
            versions = s["versions"] if node == "attempt-1" else s["own_versions"]
            point, nth = process.choice(COMMIT_STEPS), process.randint(1, versions)
            if kind == "kill":
                plan.add(PointFault("kill", point, node=node, nth=nth))
            elif kind == "freeze":
                plan.add(PointFault("freeze", point, node=node, nth=nth, duration_s=process.uniform(1.0, 40.0)))
            else:
                plan.add(PointFault("clock-step", point, node=node, nth=nth,
                                    step_s=process.choice([-3600.0, -30.0, -1.0, 1.0, 30.0, 86_400.0])))
        return plan

    # --- the actors ---------------------------------------------------------------------
    def start(self, world: World, root: Path) -> None:
        self.container = world.container(CONTAINER)
        self.root = root
        self.committed: dict[str, dict[str, str]] = {}
        """version -> its files' SHA-256, for every version an attempt of the run committed."""
        self.produced: dict[str, dict[str, str]] = {}
        """The same for every version the run uploaded, its commit answered or not (a commit whose
        pointer write landed, its reply lost, while another writer moved the pointer, is the run's)."""
        self.pointers: list[bytes] = []
        """The run's signed pointers as committed, oldest first (what a replay writes back)."""
        self.restores: list[tuple[str, str | None, dict[str, str]]] = []
        """(which restore, the version it took or None, the files it wrote)."""
        self.own_last: str | None = None
        self.seen_at_claim: str | None = None
        self.refusals: list[str] = []
        self.attacks_done: list[str] = []
        self.rewritten: set[str] = set()
        """Versions whose manifest the other job rewrote."""
        self.foreign: list[str] = []
        """Versions the other job wrote (retention counts them like the run's)."""
        self.seen: set[str] = set()
        """Every version the controller saw committed at a look."""
        self.commit_errors: list[str] = []
        """Commits refused with no write of the other job since the attempt's previous one."""
        self.last_try: dict[str, float] = {}
        self.attacked_at: list[float] = []
        self.in_flight: str | None = None
        """The other job's attack under way: its writes may have landed, answered or not."""
        self.pointer_written_at: list[float] = []
        """When each of the other job's pointer writes had ended (its write may land until then)."""
        self.own_last_at = 0.0
        self.killed: list[str] = []
        """The attempts whose process a fault killed."""
        self.record = Record(run=RUN, recipe="recipe.yaml", policy={})
        self.evidence = Evidence(self.container, PREFIX, secret=SECRET)
        self.supervisor = Supervisor(store=None, service=None, evidence=self.evidence, policy=None,  # type: ignore[arg-type]
                                     echo=lambda text: world.sim.note(world.sim.current(), "controller", text))
        self.first = Attempt(number=1, job=_attempt(1), claimed_at="2026-11-29T00:00:00Z", nodes=1)
        self.record.attempts.append(self.first)
        self.deleted_early: list[Violation] = []
        world.blob.watchers.append(lambda op, container, blob: self._deleted(world) if container == CONTAINER else None)
        self.attempt1 = world.spawn("attempt-1", self._attempt1(world), node=world.node("attempt-1"))
        world.spawn("controller", self._controller(world), node=world.node("controller", principal="controller"))
        world.spawn("other-job", self._other_job(world), node=world.node("other-job"))

    @staticmethod
    def _manifests(world: World) -> set[str]:
        """The versions whose manifest the service holds now (its own state, not a request)."""
        prefix = f"{PREFIX}/manifests/"
        blobs = world.blob.accounts[ACCOUNT].containers[CONTAINER].blobs
        return {name[len(prefix):-len(".json")] for name, blob in blobs.items()
                if name.startswith(prefix) and name.endswith(".json") and blob.committed}

    def _deleted(self, world: World) -> None:
        """After every write: a version the controller saw, gone with fewer than KEEP newer
        ones left, was not dropped by retention (`seen-deleted`)."""
        present = self._manifests(world)
        for version in sorted(self.seen - present, key=_order):
            self.seen.discard(version)
            newer = [v for v in present if _order(v) > _order(version)]  # retention's order
            if len(newer) < KEEP and version not in self.rewritten:
                self.deleted_early.append(Violation("seen-deleted", f"at {world.now:.1f}s: {version}, seen committed by "
                                                    f"the controller, was deleted with {len(newer)} newer version(s) "
                                                    f"left (keep {KEEP})"))

    def _store(self, env: dict[str, str] | None, trust: RestoreTrust | None = None) -> CheckpointStore:
        return CheckpointStore(self.container, PREFIX, environ=env, trust=trust, workers=2)

    def _commit(self, world: World, store: CheckpointStore, folder: Path, label: str) -> str | None:
        (folder / "model.bin").write_bytes(f"{label}@{world.now:.1f}|".encode() * 64)
        (folder / "trainer.json").write_text(json.dumps({"by": label, "at": round(world.now, 1)}))
        files = _digest(folder)
        named: list[str] = []
        new_version = store.new_version

        def naming(previous):  # the version this upload makes, known even when its commit then fails
            version, sequence = new_version(previous)
            named.append(version)
            self.produced[version] = files
            return version, sequence

        store.new_version = naming  # type: ignore[method-assign]
        try:
            result = store.upload(folder, keep=KEEP)
        except CheckpointError as exc:
            world.sim.note(world.sim.current(), label, f"commit refused: {exc}")
            since = self.last_try.get(label[:2], 0.0)
            if not any(since <= at <= world.now for at in self.attacked_at):
                self.commit_errors.append(f"{label}: {exc}")
            return None
        finally:
            self.last_try[label[:2]] = world.now
            store.new_version = new_version  # type: ignore[method-assign]
        if result.version:
            self.committed[result.version] = files
            found = self.container.get_blob_client(store.pointer_name).download_blob().readall()
            if json.loads(found).get("version") == result.version:
                self.pointers.append(found)
        return result.version

    def _attempt1(self, world: World):
        def run() -> None:
            folder = self.root / "attempt-1"
            folder.mkdir(parents=True, exist_ok=True)
            store = self._store(_environ(_attempt(1), pins={}))
            for k in range(self.settings["versions"]):
                world.sim.sleep(self.settings["interval_s"])
                self._commit(world, store, folder, f"a1-{k}")
        return run

    def _controller(self, world: World):
        s = self.settings

        def run() -> None:
            clock = datetime(2026, 11, 29, tzinfo=UTC)
            def look() -> None:
                self.supervisor._note_commit(self.record, self.first, clock + timedelta(seconds=world.now))
                if self.first.commit_seen and self.first.commit_seen[0] in self._manifests(world):
                    self.seen.add(self.first.commit_seen[0])

            while not self.attempt1.finished:
                world.sim.sleep(s["look_s"])
                look()
            if self.attempt1.state == "killed":
                self.killed.append("attempt-1")
            world.sim.sleep(s["claim_after_s"])
            look()
            _, self.seen_at_claim, _ = _pointer_bounds(self.record)
            checked = self.evidence.checked(*_pointer_bounds(self.record))  # the claim's pins (Supervisor._claim)
            self.refusals += checked.refused
            pins = pins_document(checked.pins)
            second = Attempt(number=2, job=_attempt(2), claimed_at="", nodes=1, resumed_version=checked.version,
                             restore_pin=pins)
            self.record.attempts.append(second)
            second_task = world.spawn("attempt-2", self._attempt2(world, pins), node=world.node("attempt-2"))
            world.spawn("launcher-2", self._launcher2(world, pins, second_task), node=world.node("launcher-2"))
        return run

    def _launcher2(self, world: World, pins: dict[str, Any], training):
        """Attempt 2's launcher: when its training process was killed, it restarts it in the job,
        and the restart restores (the attempt's environment, pins included, unchanged)."""
        def run() -> None:
            world.sim.join(training)
            if training.state == "killed":
                self.killed.append("attempt-2")
                self._restore(world, _environ(_attempt(2), pins), "attempt-2-restart")
        return run

    def _restore(self, world: World, env: dict[str, str], label: str) -> str | None:
        store = self._store(env, RestoreTrust.from_environ(env, PREFIX))
        target = self.root / label
        try:
            manifest = store.latest()
            if manifest is not None:
                store.restore(target, manifest)
        except CheckpointError as exc:  # a rewritten manifest refused: nothing restored
            world.sim.note(world.sim.current(), label, f"restore refused: {exc}")
            manifest = None
        version = manifest.version if manifest else None
        self.restores.append((label, version, _digest(target) if version and target.is_dir() else {}))
        return version

    def _attempt2(self, world: World, pins: dict[str, Any]):
        def run() -> None:
            env = _environ(_attempt(2), pins)
            self._restore(world, env, "attempt-2")
            folder = self.root / "attempt-2-work"
            folder.mkdir(parents=True, exist_ok=True)
            store = self._store(env, RestoreTrust.from_environ(env, PREFIX))
            for k in range(self.settings["own_versions"]):
                world.sim.sleep(self.settings["interval_s"])
                started = world.now  # its pointer is written during the upload, before retention
                committed = self._commit(world, store, folder, f"a2-{k}")
                if committed:
                    self.own_last, self.own_last_at = committed, started
            self._restore(world, env, "attempt-2-restart")
        return run

    def _other_job(self, world: World):
        def run() -> None:
            for kind, at in self.settings["attacks"]:
                world.sim.sleep(max(0.0, at - world.now))
                self.attacked_at.append(world.now)  # from its start: its writes land while it runs
                self.in_flight = kind  # until it returns (a lost reply's wait may outlast the run)
                try:
                    done = self._attacks()[kind](world) is not False
                except Exception as exc:  # noqa: BLE001 - its write may still have landed (a lost reply)
                    world.sim.note(world.sim.current(), "other-job", f"{kind}: {type(exc).__name__}: {exc}")
                    done = True
                self.in_flight = None
                if done:
                    self.attacks_done.append(kind)
                    if kind != "rewrite-manifest":
                        self.pointer_written_at.append(world.now)
                else:
                    self.attacked_at.pop()  # it found nothing to write
        return run

    # --- what the other job does --------------------------------------------------------------
    def _foreign(self, world: World, signed: bool) -> None:
        """A complete version of its own (parts, manifest, pointer with the manifest's digest),
        named past the run's, and `latest` pointing at it: unsigned, or signed with the other
        job's own attempt key (it cannot know the run's secret)."""
        folder = self.root / f"other-{world.now:.0f}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.bin").write_bytes(b"not this run's weights|" * 64)
        store = self._store(None)
        version = f"{900000 + len(self.committed):06d}-20261129T000000Z-beef"
        entries = store.stage(folder, list(scan(folder).values()), version)
        manifest = Manifest(version, sequence_of(version), "2026-11-29T00:00:00+00:00",
                            sorted(entries, key=lambda e: e["path"]), {"layout": "folder"})
        self.foreign.append(version)
        self.container.upload_blob(store.manifest_name(version), json.dumps(manifest.to_json()).encode(), overwrite=True)
        pointer = {"schema": SCHEMA, "version": version, "manifest": store.manifest_name(version),
                   "createdAt": manifest.created_at, MANIFEST_DIGEST: manifest.digest}
        if signed:
            job = "other-job-attempt-1"
            pointer = nodestatus.sign_pointer(nodestatus.attempt_key(OTHER_SECRET, job), job, pointer)
        self.container.upload_blob(store.pointer_name, json.dumps(pointer).encode(), overwrite=True)
        world.sim.note(world.sim.current(), "other-job", f"pointed latest at its own {version} "
                                                         f"({'signed with its own key' if signed else 'unsigned'})")

    def _attacks(self) -> dict[str, Any]:
        return {"foreign-unsigned": lambda world: self._foreign(world, signed=False),
                "foreign-signed": lambda world: self._foreign(world, signed=True),
                "replay": self._replay, "rewrite-manifest": self._rewrite_manifest}

    def _replay(self, world: World) -> bool:
        """The run's first pointer, written back once a newer one was committed."""
        if len(self.pointers) < 2:
            return False
        self.container.upload_blob(f"{PREFIX}/latest", self.pointers[0], overwrite=True)
        world.sim.note(world.sim.current(), "other-job", "wrote back the run's first pointer")
        return True

    def _rewrite_manifest(self, world: World) -> bool:
        """The manifest `latest` names, its model file swapped for bytes of the other job's
        (their true size and hash, so a restore's own check of the bytes passes)."""
        store = self._store(None)
        pointer, _ = store.pointer()
        if not pointer:
            return False
        name = store.manifest_name(str(pointer["version"]))
        document = json.loads(self.container.get_blob_client(name).download_blob().readall())
        evil = b"weights the run never saved|" * 64
        blob = f"{store.data_prefix()}other/model.bin"
        self.container.upload_blob(blob, evil, overwrite=True)
        for entry in document.get("files", []):
            if entry.get("path") == "model.bin":
                entry.update(blob=blob, size=len(evil), sha256=hashlib.sha256(evil).hexdigest())
                entry.pop("account", None)
        self.rewritten.add(str(pointer["version"]))  # before the write: it may land with its reply lost
        self.container.upload_blob(name, json.dumps(document).encode(), overwrite=True)
        world.sim.note(world.sim.current(), "other-job", f"rewrote {name}")
        return True

    # --- the end ------------------------------------------------------------------------------
    def finish(self, world: World) -> None:
        world.sim.run_until(lambda: len(self.restores) >= 2, limit_s=self.duration_s * 3)

    def check(self, world: World) -> list[Violation]:
        found: list[Violation] = []
        for label, version, files in self.restores:
            if version is None:
                continue
            if version not in self.produced:
                found.append(Violation("restored-foreign", f"{label} restored {version}, which no attempt of the run "
                                                            "uploaded"))
            elif files != self.produced[version]:
                found.append(Violation("restored-rewritten", f"{label} restored {version}, but not the files the run "
                                                             "committed in it"))
        first = next((v for label, v, _ in self.restores if label == "attempt-2"), None)
        seen = self.seen_at_claim
        if seen and first is not None and sequence_of(first) < sequence_of(seen):
            found.append(Violation("restored-stale", f"attempt 2 restored {first}, though its controller had seen "
                                                     f"{seen} committed before the claim"))
        pointer_kinds = [*self.attacks_done, *([self.in_flight] if self.in_flight else [])]
        pointer_written = any(kind != "rewrite-manifest" for kind in pointer_kinds)
        if seen and first is None and seen not in self.rewritten and not pointer_written:
            found.append(Violation("restore-lost", f"attempt 2 restored nothing, though its controller had seen {seen} "
                                                   "committed and nobody rewrote it"))
        again = next((v for label, v, _ in self.restores if label == "attempt-2-restart"), None)
        hidden = any(at >= self.own_last_at for at in self.pointer_written_at) or \
            self.in_flight not in (None, "rewrite-manifest")
        if self.own_last and not hidden and ((again is None and self.own_last not in self.rewritten)
                              or (again is not None and sequence_of(again) < sequence_of(self.own_last))):
            found.append(Violation("restart-went-back", f"attempt 2's restart restored {again or 'nothing'}, not its "
                                                        f"own last commit {self.own_last}"))
        if self.commit_errors:
            found.append(Violation("commit-refused", self.commit_errors[0]))
        found += self.deleted_early[:1]
        self.metrics = {"committed": len(self.committed), "restores": [v for _, v, _ in self.restores],
                        "seen_at_claim": self.seen_at_claim, "refused": len(self.refusals),
                        "attacks": ",".join(self.attacks_done) or "none", "killed": ",".join(self.killed) or "none"}
        return found

