"""The offline plan: the real program under Pulumi's mock runtime, no Azure, no Pulumi CLI.

`evaluate(stack)` validates the stack file (a bad value raises `UserError` before any
resource is registered), runs `amlhpc.infra.program.build` with `RecordingMonitor`, and returns
every resource with its inputs and options, the outputs document, the cost and the quota,
in a canonical order: the same stack gives the same plan byte for byte. See
docs/contracts.md section 3.

Each evaluation runs on its own thread, through the SDK's public testing API
(`pulumi.runtime.set_mocks`, `pulumi.runtime.test`), so Pulumi's context-local runtime
state never leaks between evaluations (tests, `--offline` in jobs). azure-native's service
packages load only the resources the program uses (amlhpc/infra/plan/lazy_provider.py), and the
provider's API-version aliases are dropped before the SDK resolves them: the two largest
costs of an evaluation (measurements in bench/RESULTS.md). tests/test_plan_sdk.py holds the SDK surfaces
used here to the versions pyproject.toml pins.
"""

from __future__ import annotations

import gc
import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from amlhpc.infra.plan import lazy_provider

lazy_provider.install()  # before anything imports pulumi_azure_native

from amlhpc.core.quota import Need  # noqa: E402
from amlhpc.infra import published  # noqa: E402
from amlhpc.infra.config import (  # noqa: E402
    REPO_ROOT,
    StackConfig,
    check_experiment_against_environment,
    load_stack_config,
)
from amlhpc.infra.plan.cost import Cost, cost, quota  # noqa: E402
from amlhpc.infra.plan.event_loop import private_event_loop  # noqa: E402
from amlhpc.infra.plan.mocks import (  # noqa: E402
    FAKE_SUBSCRIPTION,
    PlanMocks,
    RecordedResource,
    RecordingMonitor,
    qualified_name,
)

PROJECT = "aml-hpc"


@dataclass
class Plan:
    config: StackConfig
    resources: list[RecordedResource]
    outputs: dict[str, Any]
    secret_outputs: list[str]
    cost: Cost
    quota: list[Need]
    environment: Plan | None = field(default=None, repr=False)
    """For experiment stacks: the plan of the environment they join."""
    subscription_id: str = FAKE_SUBSCRIPTION
    """The subscription the plan was evaluated for (ids and custom role GUIDs derive from it)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.config.stack,
            "kind": self.config.kind,
            "source": self.config.source,
            "note": "offline plan: desired state under Pulumi mocks; ids and endpoints are synthetic",
            "resources": [r.to_json() for r in self.resources],
            "outputs": self.outputs,
            "secretOutputs": self.secret_outputs,
            "cost": self.cost.to_json(),
            "quota": [q.to_json() for q in self.quota],
            "reachability": self.reachability().to_json(),
            "limits": [c.to_json() for c in self.limits()],
            "storageLoad": [a.to_json() for a in self.storage_load()],
        }

    def storage_load(self) -> list[Any]:
        """Each storage account's expected load at full scale against Azure's targets (amlhpc/core/storage_load.py)."""
        from amlhpc.infra.plan.limits import storage_load

        return storage_load(self.config)

    def limits(self) -> list[Any]:
        """Azure ML's and the registry's limits against the stack's clusters (amlhpc/infra/plan/limits.py)."""
        from amlhpc.infra.plan.limits import checks

        return checks(self.config)

    def reachability(self):
        """Who can reach what, from where (amlhpc/infra/plan/reachability.py)."""
        from amlhpc.infra.plan.reachability import reachability

        return reachability(self)

    def custom_resources(self) -> list[RecordedResource]:
        return [r for r in self.resources if r.custom]

    def by_component(self) -> list[tuple[str, RecordedResource | None, list[RecordedResource]]]:
        return by_component(self.resources)

    def of_type(self, type_token: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.type == type_token]


def component_names(resources: list[RecordedResource]) -> dict[str, str]:
    """urn -> the logical name of the top-level component it belongs to ("" for a
    resource declared outside any component)."""
    by_urn = {r.urn: r for r in resources}
    names: dict[str, str] = {}
    for r in resources:
        top: RecordedResource | None = r
        while top is not None and top.parent in by_urn:
            top = by_urn[top.parent]
        names[r.urn] = "" if top is None or (top is r and r.custom) else top.name
    return names


def canonical_order(resources: list[RecordedResource]) -> list[RecordedResource]:
    """Grouped by top-level component (by name), the component first, then by type and
    Azure name: the same program gives the same order whatever the registration order."""
    component = component_names(resources)
    urns = {r.urn for r in resources}

    def key(r: RecordedResource) -> tuple:
        top_level_component = not r.custom and r.parent not in urns
        return (component[r.urn], 0 if top_level_component else 1, r.type,
                qualified_name(r.type, r.inputs, r.name), r.urn)

    return sorted(resources, key=key)


def by_component(resources: list[RecordedResource]) -> list[tuple[str, RecordedResource | None, list[RecordedResource]]]:
    """(component name, the component resource or None, its Azure resources), in canonical order."""
    component = component_names(resources)
    urns = {r.urn for r in resources}
    groups: dict[str, tuple[RecordedResource | None, list[RecordedResource]]] = {}
    for r in canonical_order(resources):
        name = component[r.urn]
        head, members = groups.setdefault(name, (None, []))
        if r.custom:
            members.append(r)
        elif r.parent not in urns:
            groups[name] = (r, members)
    return [(name, head, members) for name, (head, members) in groups.items()]


def evaluate(stack: str, root: Path = REPO_ROOT, now: datetime | None = None,
             subscription_id: str = FAKE_SUBSCRIPTION) -> Plan:
    """Plan `stack` from `root/Pulumi.<stack>.yaml`. Raises UserError on bad config."""
    cfg = load_stack_config(stack, root, now=now)
    env_plan = None
    environment = None
    if cfg.is_experiment:
        env_plan = evaluate(cfg.environment, root, now, subscription_id)
        check_experiment_against_environment(cfg, env_plan.config)
        # what the environment's up would publish (amlhpc/infra/published.py)
        environment = published.offline(env_plan.outputs, cfg.environment)

    from amlhpc.infra import program

    resources, outputs, secrets = record(lambda: program.build(cfg, now=now, environment=environment), cfg.stack,
                                         subscription_id=subscription_id)
    return Plan(cfg, resources, outputs, secrets, cost(cfg), quota(cfg), env_plan, subscription_id)


def offline_outputs(stack: str, root: Path = REPO_ROOT) -> dict[str, Any]:
    """The stack outputs document the deployed stack would have (docs/contracts.md §2)."""
    return evaluate(stack, root).outputs


def record(build: Callable[[], dict[str, Any] | None], stack: str = "test",
           subscription_id: str = FAKE_SUBSCRIPTION) -> tuple[list[RecordedResource], dict[str, Any], list[str]]:
    """Run `build` under the recording mock runtime on a fresh thread.

    Returns the recorded resources, the resolved dict `build` returned (JSON-safe) and the
    keys of that dict whose values are Pulumi secrets. Exceptions from `build` or from
    resource registration are re-raised here.
    """
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = _run(build, stack, subscription_id)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            result["error"] = exc

    worker = threading.Thread(target=run, name=f"plan-{stack}")
    with _fewer_collections():
        worker.start()
        worker.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


@contextmanager
def _fewer_collections(gen0: int = 50_000) -> Iterator[None]:
    """Collect garbage less often while the program runs: it allocates many short-lived
    objects next to azure-native's hundreds of thousands of long-lived ones, and the
    collector's passes over those were a quarter of an evaluation (bench/RESULTS.md).
    An evaluation's garbage is small; the usual thresholds come back afterwards."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], gen0), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


_VERSIONED_TYPE = re.compile(r"^azure-native:[a-zA-Z]+/v\d")


def _drop_provider_version_aliases(args):
    """azure-native gives every resource fifty-odd aliases to its older API-version type
    tokens (state migration between provider versions). They mean nothing to a plan but
    cost the SDK four fifths of an evaluation; aliases we declare ourselves are kept."""
    import pulumi

    aliases = args.opts.aliases
    if not aliases:
        return None
    kept = [a for a in aliases if not (isinstance(a, pulumi.Alias) and isinstance(a.type_, str)
                                       and _VERSIONED_TYPE.match(a.type_))]
    if len(kept) == len(aliases):
        return None
    opts = pulumi.ResourceOptions.merge(args.opts, None)  # a copy; merge leaves both unchanged
    opts.aliases = kept
    return pulumi.ResourceTransformationResult(args.props, opts)


def _run(build: Callable[[], dict[str, Any] | None], stack: str, subscription_id: str):
    """One program run under the mock runtime, through the SDK's public testing API
    (`set_mocks`, `pulumi.runtime.test`). Runs on a fresh thread: Pulumi keeps its root
    resource in a context variable, which a new thread starts without."""
    import pulumi

    resolved: dict[str, Any] = {}
    secret_keys: list[str] = []

    async def resolve(document: dict[str, Any] | None) -> None:
        for key, value in (document or {}).items():
            out = pulumi.Output.from_input(value)
            resolved[key] = await out.future()
            if await out.is_secret():
                secret_keys.append(key)

    with private_event_loop():
        monitor = RecordingMonitor(PlanMocks(subscription_id))
        pulumi.runtime.set_mocks(monitor.mocks, project=PROJECT, stack=stack, preview=False, monitor=monitor)
        pulumi.runtime.register_stack_transformation(_drop_provider_version_aliases)
        # `test` clears the runtime's pending work, runs the program, waits for every
        # registration, and raises what the program or a registration raised.
        pulumi.runtime.test(lambda: resolve(build()))()
    resources = canonical_order(monitor.recorded)
    return resources, json.loads(json.dumps(resolved, default=str)), sorted(secret_keys)
