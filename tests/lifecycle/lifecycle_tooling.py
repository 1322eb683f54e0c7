"""What one adopter does, step for step as docs/deploying.md says, against the emulator.

An `Adopter` is a clone of this repository (its own stack files in a directory), a Pulumi
backend and an Azure subscription; several adopters share one `FakeAzure`. `make_up` and
`make_down` do what `make up STACK=...` and `make down STACK=...` do through
scripts/pulumi-stack.sh, calling the same Python the script calls (amlhpc.infra.adopt):

    up (environment):  ensure the stack's name suffix -> stack select --create ->
                       stack export -> amlhpc.infra.adopt.plan_import -> pulumi import --file
                       --protect=false (when there is something to adopt) -> up --refresh,
                       again after a wait when it failed on RBAC propagation
    up (experiment):   stack select --create -> up --refresh
    preview (environment): ensure the stack's name suffix -> stack select --create ->
                       stack export -> amlhpc.infra.adopt.plan_import -> import and preview on a
                       scratch copy of the state (nothing written)
    preview (experiment): stack select --create -> preview
    down (environment): destroy --refresh --exclude-protected (the stack stays)
    down (experiment):  destroy --refresh -> stack rm (which deletes the stack file)
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from amlhpc.infra import adopt, published, quirks
from amlhpc.infra.config import EXPERIMENT_PREFIX, REPO_ROOT, parse, read_stack_file, stack_file
from tests.lifecycle.lifecycle_cloud import ROLE, FakeAzure
from tests.lifecycle.lifecycle_engine import DeploymentFailed, Engine


@dataclass
class EmulatedArm:
    """amlhpc.infra.adopt.AzureReader on the emulated cloud, answering in ARM's wire shape: an
    identity's principal under `properties` (user-assigned) or `identity` (system-assigned),
    role assignments listed at a scope and above it, as `$filter=atScope()` lists them."""

    azure: FakeAzure

    def exists(self, r: adopt.Retained) -> bool:
        return self.azure.exists(r.arm_id)

    def read(self, arm_id: str, api_version: str) -> dict[str, Any] | None:
        answer = self.azure.response(arm_id)
        if answer is None:
            return None
        return {"id": arm_id, "properties": answer, "identity": answer.get("identity")}

    def role_assignments(self, scope: str) -> list[dict[str, Any]]:
        out = []
        for o in self.azure.of_type(ROLE):
            at = o.id.split("/providers/Microsoft.Authorization/")[0]
            if scope.lower() == at.lower() or scope.lower().startswith(at.lower() + "/"):
                out.append({"id": o.id, "name": o.id.rsplit("/", 1)[-1], "type": "Microsoft.Authorization/roleAssignments",
                            "properties": {k: o.body.get(k) for k in ("principalId", "roleDefinitionId", "principalType")}
                            | {"scope": at}})
        return out


ADOPTERS_GROUP = "0a0a0a0a-1b1b-2c2c-3d3d-4e4e4e4e4e4e"
"""The Entra group whose people sign in to a shipped jump box (an adopter's own)."""


def clone(root: Path) -> Path:
    """The files of a fresh clone a deployment reads (the project and stack files), with
    what docs/isolation.md asks of an adopter before the first `make up`: the group that
    signs in to a shipped jump box (`jumpBox.logins`; deploying refuses a jump box nobody
    can use)."""
    root.mkdir(parents=True, exist_ok=True)
    for path in REPO_ROOT.glob("Pulumi*.yaml"):
        shutil.copy(path, root / path.name)
        if path.name == "Pulumi.yaml":
            continue
        config = read_stack_file(path.name[len("Pulumi."):-len(".yaml")], root)
        box = ((config.get("aml-hpc:network") or {}).get("wayIn") or {}).get("jumpBox")
        if box is not None and not box.get("logins"):
            box["logins"] = [{"principalId": ADOPTERS_GROUP, "principalType": "Group"}]
            (root / path.name).write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    return root


@dataclass
class Adopter:
    azure: FakeAzure
    root: Path
    subscription_id: str
    engine: Engine = field(init=False)
    adopted: list[str] = field(default_factory=list)
    """URNs the last `make_up` imported."""
    wait_operations: int = 10
    """What the script's wait between attempts is worth on the emulated cloud's clock."""
    retries: int = 0
    """Ups the tooling ran again after an RBAC propagation failure."""
    published: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Environment -> the outputs document its last up published (scripts/pulumi-stack.sh:
    `published/outputs.json` in its state container); an environment's down removes it."""

    def __post_init__(self) -> None:
        self.engine = Engine(self.azure, self.subscription_id)

    def config(self, stack: str):
        return parse(stack, read_stack_file(stack, self.root), f"Pulumi.{stack}.yaml",
                     now=self.azure.now, deploying=True)

    def make_up(self, stack: str) -> dict[str, Any]:
        from amlhpc.infra import program

        experiment = stack.startswith(EXPERIMENT_PREFIX)
        if not experiment:
            adopt.ensure_suffix(stack, self.root)
        self.engine.select(stack)
        self.adopted = []
        if not experiment:
            document = adopt.plan_import(stack, self.engine.select(stack).export(), self.subscription_id,
                                         EmulatedArm(self.azure), root=self.root)
            if document["resources"]:
                self.adopted = self.engine.import_file(stack, document, protect=False)
        cfg = self.config(stack)
        environment = self.environment_outputs(cfg)
        for attempt in range(1, quirks.RBAC_PROPAGATION_ATTEMPTS + 1):
            try:
                outputs = self.engine.up(stack, lambda: program.build(cfg, now=self.azure.now, environment=environment))
                if not experiment:  # the script publishes an environment's outputs after its up
                    self.published[stack] = published.publish(outputs, stack, now=self.azure.now)
                return outputs
            except DeploymentFailed as failure:
                # scripts/pulumi-stack.sh: a fresh grant not in effect yet -> wait, then up again
                if attempt == quirks.RBAC_PROPAGATION_ATTEMPTS or not adopt.rbac_propagation_failure(str(failure)):
                    raise
                self.retries += 1
                self.azure.wait(self.wait_operations)
        raise AssertionError("unreachable")

    def make_preview(self, stack: str) -> list[tuple[str, str]]:
        """`make preview STACK=...`: the steps the preview shows (import|create|update|replace|delete, URN)."""
        from amlhpc.infra import program

        experiment = stack.startswith(EXPERIMENT_PREFIX)
        if not experiment:
            adopt.ensure_suffix(stack, self.root)
        self.engine.select(stack)
        document = None if experiment else adopt.plan_import(
            stack, self.engine.select(stack).export(), self.subscription_id, EmulatedArm(self.azure), root=self.root)
        cfg = self.config(stack)
        environment = self.environment_outputs(cfg)
        return self.engine.preview(stack, lambda: program.build(cfg, now=self.azure.now, environment=environment),
                                   document)

    def environment_outputs(self, cfg) -> published.EnvironmentOutputs | None:
        """An experiment's environment outputs, as the script fetches them: the published
        document (refused, as the script refuses, when the environment published none)."""
        if not cfg.is_experiment:
            return None
        if cfg.environment not in self.published:
            raise DeploymentFailed(f"environment {cfg.environment!r} has published no outputs: bring it up first")
        return published.from_document(self.published[cfg.environment], cfg.environment, f"published/{cfg.environment}")

    def make_down(self, stack: str) -> None:
        if stack.startswith(EXPERIMENT_PREFIX):
            self.engine.destroy(stack)
            self.engine.remove(stack)
            stack_file(stack, self.root).unlink(missing_ok=True)  # `pulumi stack rm` deletes it
        else:
            self.engine.destroy(stack, exclude_protected=True)
            self.published.pop(stack, None)

    def state(self, stack: str):
        return self.engine.select(stack).resources
