"""Under the Pulumi engine the stack config arrives through `pulumi.Config` (strings, with
objects JSON-encoded) instead of the file: it must validate to the same StackConfig, and a
bad value must stop the program before any resource is registered."""

from __future__ import annotations

import json
import threading

import pytest
import yaml

from amlhpc.core.errors import UserError
from amlhpc.infra.config import NAME_SUFFIX_KEY, REPO_ROOT, from_pulumi, parse

SUFFIX = "k3x9q2"
"""The per-stack name suffix `make preview` writes into a stack file before the first deploy."""


JUMP_BOX_LOGINS = [{"principalId": "11111111-2222-3333-4444-555555555555", "principalType": "Group"}]
"""Who signs in to a shipped jump box: the first deploy refuses one nobody can use, so an
adopter names their group first (docs/isolation.md)."""


def deployed_file(stack: str) -> dict:
    """Pulumi.<stack>.yaml as it is deployed: with its aml-hpc:nameSuffix (the tooling writes
    it) and the jump box's logins (the adopter adds them)."""
    document = yaml.safe_load((REPO_ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
    box = ((document.get("aml-hpc:network") or {}).get("wayIn") or {}).get("jumpBox")
    if box is not None and not box.get("logins"):
        box["logins"] = JUMP_BOX_LOGINS
    return {**document, NAME_SUFFIX_KEY: SUFFIX}


def engine_config(stack: str) -> dict[str, str]:
    """What the engine hands the program for Pulumi.<stack>.yaml: every value a string."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in deployed_file(stack).items()}


def in_engine(stack: str, config: dict[str, str], fn):
    """Run `fn` on a fresh thread with the engine's settings and config in place."""
    from pulumi.runtime import config as runtime_config
    from pulumi.runtime import settings

    box: dict = {}

    def run():
        try:
            settings.configure(settings.Settings(project="aml-hpc", stack=stack))
            runtime_config.set_all_config(config)
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
            box["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_engine_config_equals_the_file(stack):
    assert in_engine(stack, engine_config(stack), from_pulumi) == parse(stack, deployed_file(stack), f"Pulumi.{stack}.yaml")


def test_engine_refuses_an_environment_without_its_name_suffix():
    """A deploy without aml-hpc:nameSuffix would ask Azure for every other adopter's names."""
    config = engine_config("dev")
    del config[NAME_SUFFIX_KEY]
    with pytest.raises(UserError) as info:
        in_engine("dev", config, from_pulumi)
    text = info.value.render()
    assert "aml-hpc:nameSuffix" in text and "make preview STACK=dev" in text


def test_pulumi_config_set_override_is_honoured():
    config = engine_config("dev")
    clusters = json.loads(config["aml-hpc:clusters"])
    clusters[0]["maxNodes"] = 1
    config["aml-hpc:clusters"] = json.dumps(clusters)
    assert in_engine("dev", config, from_pulumi).clusters[0].max_nodes == 1


def test_bad_value_under_the_engine_names_the_stack_file():
    config = engine_config("prod")
    config["aml-hpc:network"] = json.dumps({"isolation": "private"})
    with pytest.raises(UserError) as info:
        in_engine("prod", config, from_pulumi)
    assert "Pulumi.prod.yaml: aml-hpc:network.addressSpace" in info.value.render()


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_engine_entry_point_declares_the_same_resources_as_the_plan(stack, tmp_path):
    """amlhpc.infra.engine.run (what `pulumi up` executes) under the mock runtime."""
    from pulumi.runtime import config as runtime_config

    from amlhpc.infra import engine
    from amlhpc.infra.plan import evaluate, record

    config = engine_config(stack)

    def program():
        runtime_config.set_all_config(config)
        engine.run()

    resources, _, _ = record(program, stack=stack)
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": deployed_file(stack)}))
    planned = evaluate(stack, tmp_path)
    assert sorted((r.type, r.name) for r in resources) == sorted((r.type, r.name) for r in planned.resources)


def test_engine_refuses_bad_config_before_any_resource():
    import pulumi
    from pulumi.runtime import config as runtime_config

    from amlhpc.infra import engine
    from amlhpc.infra.plan import record

    config = engine_config("dev")
    config["aml-hpc:clusters"] = json.dumps([{"name": "x", "sku": "Standard_Nope", "maxNodes": 1}])
    seen = []

    def program():
        runtime_config.set_all_config(config)
        try:
            engine.run()
        except pulumi.RunError as exc:
            seen.append(str(exc))

    resources, _, _ = record(program, stack="dev")
    assert resources == [] and "aml-hpc:clusters[0].sku" in seen[0] and "unknown VM size" in seen[0]
