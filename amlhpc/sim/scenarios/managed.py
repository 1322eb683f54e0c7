"""Managed-run revival: the schedule's checks that replace a dead controller.

`revival`: a managed run's controller is gone (its job failed; nobody holds the record's
lease). The revival schedule fires (amlhpc.jobs.managed.revive.revive, with the real
RecordStore on the simulated supervision container and AzureControllerLauncher on the
simulated Azure ML), and a second firing - a schedule that fired twice, a check started by
hand, the local rehearsal's loop - overlaps it by a seeded offset. A controller job it
starts queues for a seeded time, then runs and takes the record's lease, renewing it as the
supervision loop does. Resource Manager's throttling applies to every call.

Invariant: `two-controllers`: more than one controller job of the run is alive (queued,
preparing or running) at once.
"""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

from amlhpc.jobs.managed.record import Record, RecordStore
from amlhpc.jobs.managed.revive import AzureControllerLauncher, revive
from amlhpc.sim.arm import MLClient, SimJob
from amlhpc.sim.faults import FaultPlan, RequestFault
from amlhpc.sim.scenario import Scenario, Violation
from amlhpc.sim.world import World

SUPERVISION = "supervision"
PREFIX = "exp/run"
RUN = "run-7"
CONTROLLER_IDENTITY = "controller-identity"


class Revival(Scenario):
    name = "revival"
    summary = "overlapping revival checks of a run whose controller died; each starts a controller when none lives"
    duration_s = 600.0

    def plan(self, rng: random.Random, size: int | None) -> FaultPlan:
        checks = size or rng.choice([2, 2, 3])
        self.settings = {"checks": checks, "offsets_s": sorted(rng.uniform(0.0, 4.0) for _ in range(checks)),
                         "queue_s": rng.uniform(20.0, 240.0), "later_check_s": rng.uniform(60.0, 500.0)}
        plan = FaultPlan()
        if rng.random() < 0.3:
            plan.add(RequestFault("delay", node=f"check-{rng.randrange(checks)}", nth=rng.randint(1, 6),
                                  delay_s=rng.uniform(0.5, 5.0)))
        return plan

    def start(self, world: World, root: Path) -> None:
        s = self.settings
        supervision = world.container(SUPERVISION)
        arm = world.arm
        self.live_peak = 0
        self.started: list[str] = []
        first = SimpleNamespace(name=RUN, display_name=f"{RUN} managed run (controller)", tags={"managed_run": RUN},
                                experiment_name="exp", compute="controllers", status=None)
        arm.create_job(first)
        arm.set_status(RUN, "Failed")
        arm.on_create.append(self._controller_started(world))
        arm.on_status.append(lambda job, status: self._count(arm))

        def setup() -> None:
            RecordStore(supervision, PREFIX).create(Record(run=RUN, recipe="recipe.yaml", policy={}))
        world.call(setup)
        for k, offset in enumerate(s["offsets_s"]):
            node = world.node(f"check-{k}", principal=CONTROLLER_IDENTITY)
            world.spawn(f"revive-{k}", self._check(world, offset), node=node)
        node = world.node("check-later", principal=CONTROLLER_IDENTITY)
        world.spawn("revive-later", self._check(world, s["later_check_s"]), node=node)

    def _check(self, world: World, delay_s: float):
        def run() -> None:
            world.sim.sleep(delay_s)
            store = RecordStore(world.container(SUPERVISION), PREFIX)
            launcher = AzureControllerLauncher(MLClient(world.arm, CONTROLLER_IDENTITY))
            started = revive(store, launcher, RUN, echo=lambda text: world.sim.note(world.sim.current(), "revive", text))
            if started:
                self.started.append(started)
        return run

    def _count(self, arm) -> None:
        live = len(arm.live(lambda job: job.name.startswith(RUN)))
        self.live_peak = max(self.live_peak, live)

    def _controller_started(self, world: World):
        """A new controller job: it queues, then runs and holds the record's lease."""
        def created(job: SimJob) -> None:
            self._count(world.arm)
            node = world.node(f"controller-{job.name}", principal=CONTROLLER_IDENTITY)

            def controller() -> None:
                world.sim.sleep(self.settings["queue_s"])
                if world.arm.jobs[job.name].status != "Queued":
                    return
                world.arm.set_status(job.name, "Running")
                store = RecordStore(world.container(SUPERVISION), PREFIX)
                while not store.acquire():
                    world.sim.sleep(15.0)  # the supervisor's _take_lease waits for the holder to stop
                while True:
                    world.sim.sleep(store.lease_s / 3)
                    store.renew()
            world.spawn(f"controller-{job.name}", controller, node=node)
        return created

    def finish(self, world: World) -> None:
        world.run(self.duration_s)

    def check(self, world: World) -> list[Violation]:
        self._count(world.arm)
        live = [job.name for job in world.arm.live(lambda job: job.name.startswith(RUN))]
        self.metrics = {"started": self.started, "live": live, "live_peak": self.live_peak,
                        "arm_calls": sum(p.total for p in world.arm.calls.values()),
                        "arm_throttled": sum(world.arm.throttled.values())}
        if self.live_peak > 1:
            return [Violation("two-controllers", f"{self.live_peak} controller jobs of run {RUN} were alive at once "
                                                 f"(started: {', '.join(self.started)}; alive at the end: "
                                                 f"{', '.join(live) or 'none'})")]
        return []
