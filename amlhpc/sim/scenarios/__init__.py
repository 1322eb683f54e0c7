"""The scenarios of seeded exploration (amlhpc.sim.explore), each running the real code of a
part of the platform on simulated nodes, with the invariants that part must keep."""

from __future__ import annotations

from amlhpc.sim.scenario import Scenario
from amlhpc.sim.scenarios.checkpoints import CheckpointCommit, FolderUpload, PruneRace
from amlhpc.sim.scenarios.data import Staging, UploadSessions
from amlhpc.sim.scenarios.managed import Revival
from amlhpc.sim.scenarios.restart import LaunchRecords, RestartAgreement
from amlhpc.sim.scenarios.restore import RestorePin
from amlhpc.sim.scenarios.watchdog import HangCulprit, Heartbeats, SlowHeartbeats, WatchdogClock

SCENARIOS: dict[str, type[Scenario]] = {s.name: s for s in (CheckpointCommit, FolderUpload, PruneRace,
                                                             RestartAgreement, LaunchRecords, WatchdogClock,
                                                             Heartbeats, SlowHeartbeats, HangCulprit, Revival, Staging, UploadSessions,
                                                             RestorePin)}
