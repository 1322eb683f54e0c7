"""`make preview` after `make down` lists imports, not creates: the preview runs the same
adoption plan as `up` and imports it into a scratch copy of the state before previewing
(scripts/pulumi-stack.sh), so every resource `down` kept shows as an import and only what
`down` removed shows as a create. Nothing is written to Azure or to the stack."""

from __future__ import annotations

import copy

import pytest

from amlhpc.infra.adopt import SINGLETONS
from tests.lifecycle.lifecycle_cloud import FakeAzure
from tests.lifecycle.lifecycle_tooling import Adopter, clone

SUB = "aaaaaaaa-0000-0000-0000-000000000001"


@pytest.fixture
def azure() -> FakeAzure:
    return FakeAzure()


@pytest.fixture
def adopter(azure, tmp_path) -> Adopter:
    return Adopter(azure, clone(tmp_path / "clone"), SUB)


def verbs(steps: list[tuple[str, str]], verb: str) -> set[str]:
    return {urn for v, urn in steps if v == verb}


def frozen(adopter: Adopter, stack: str) -> tuple:
    """What a preview must leave as it was: Azure's objects and log, and the stack's state."""
    return (copy.deepcopy(adopter.azure.objects), list(adopter.azure.log), adopter.azure.operations,
            copy.deepcopy(adopter.state(stack)))


class TestPreviewAfterDown:
    def test_every_kept_resource_is_an_import_and_none_a_create(self, azure, adopter):
        adopter.make_up("dev")
        adopter.make_down("dev")
        before = frozen(adopter, "dev")

        steps = adopter.make_preview("dev")
        assert frozen(adopter, "dev") == before  # a preview writes nothing
        imports, creates = verbs(steps, "import"), verbs(steps, "create")
        assert imports and not imports & creates

        adopter.make_up("dev")
        state = adopter.state("dev")
        kept = {u for u, r in state.items() if r.custom and r.retain_on_delete and r.type not in SINGLETONS}
        assert kept <= imports  # every retained resource the program declares
        assert imports == {u for u in adopter.adopted if state[u].custom}  # exactly what up imported
        assert creates == {u for v, u in adopter.engine.last_steps if v == "create"}  # and up created the rest
        assert adopter.engine.last_steps and not verbs(adopter.engine.last_steps, "replace")

    def test_counter_test_a_plain_preview_shows_them_as_creates(self, azure, adopter):
        """What `make preview` showed before: `pulumi preview` alone, against the state `down` left."""
        from amlhpc.infra import program

        adopter.make_up("dev")
        adopter.make_down("dev")
        cfg = adopter.config("dev")
        plain = adopter.engine.preview("dev", lambda: program.build(cfg, now=azure.now))
        adopted = verbs(adopter.make_preview("dev"), "import")
        assert adopted and adopted <= verbs(plain, "create")

    def test_after_up_a_preview_has_nothing_to_show(self, azure, adopter):
        adopter.make_up("dev")
        assert adopter.make_preview("dev") == []

    def test_a_fresh_stack_previews_creates_and_touches_nothing(self, azure, adopter):
        steps = adopter.make_preview("dev")
        assert steps and {v for v, _ in steps} == {"create"}
        assert azure.objects == {} and azure.log == []

    def test_a_customer_key_stacks_retained_grants_preview_as_imports(self, azure, tmp_path):
        """The key's role assignments, found by (scope, role, principal) as up finds them."""
        import yaml

        from tests.conformance.conformance_stacks import EVERYTHING

        config = {**EVERYTHING, "aml-hpc:protectData": False, "aml-hpc:network": {"isolation": "public"},
                  "aml-hpc:clusters": [{"name": "nc-a100", "sku": "Standard_NC24ads_A100_v4", "maxNodes": 1}]}
        root = clone(tmp_path / "cmk")
        (root / "Pulumi.cmk.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
        adopter = Adopter(azure, root, SUB)
        adopter.make_up("cmk")
        adopter.make_down("cmk")
        imports = verbs(adopter.make_preview("cmk"), "import")
        assert {u for u in imports if "crypto-user" in u}
        adopter.make_up("cmk")
        assert imports == {u for u in adopter.adopted if adopter.state("cmk")[u].custom}
