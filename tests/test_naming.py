"""Physical names: derived names obey Azure's rules; checks refuse what Azure refuses."""

from __future__ import annotations

import pytest

from amlhpc.infra import naming


class TestCheck:
    @pytest.mark.parametrize("kind,value", [
        ("storageAccount", "abc"), ("storageAccount", "a" * 24),
        ("keyVault", "kv-a1"), ("keyVault", "a" * 24),
        ("containerRegistry", "acr01"), ("containerRegistry", "A" * 50),
        ("cluster", "abc"), ("cluster", "gpu-a100-cluster"), ("cluster", "a" * 24), ("cluster", "nd-h100"),
        ("workspace", "mlw-x_y"), ("namePrefix", "amlhpc"),
    ])
    def test_valid(self, kind, value):
        assert naming.check(kind, value) is None

    @pytest.mark.parametrize("kind,value,why", [
        ("storageAccount", "ab", "2 characters long"),
        ("storageAccount", "a" * 25, "25 characters long"),
        ("storageAccount", "Data-01", "characters Azure does not allow"),
        ("keyVault", "1kv", "characters Azure does not allow"),
        ("keyVault", "kv--double", "characters Azure does not allow"),
        ("keyVault", "kv-trailing-", "characters Azure does not allow"),
        ("containerRegistry", "acr-1", "characters Azure does not allow"),
        ("containerRegistry", "acr", "3 characters long"),
        ("cluster", "g", "1 characters long"),
        ("cluster", "a" * 25, "25 characters long"),
        ("cluster", "sweep-2", "no letter after its last hyphen"),
        ("cluster", "9gpu", "characters Azure does not allow"),
        ("cluster", "gpu_a100", "characters Azure does not allow"),
        ("cluster", "gpu-", "no letter after its last hyphen"),
        ("namePrefix", "Aml", "characters Azure does not allow"),
    ])
    def test_invalid_names_say_why_and_what_is_allowed(self, kind, value, why):
        message = naming.check(kind, value)
        assert message is not None and why in message
        assert naming.RULES[kind].allowed in message


class TestDerive:
    @pytest.mark.parametrize("stack", ["dev", "prod", "exp-bert-sweep-long-1", "staging2"])
    @pytest.mark.parametrize("prefix", ["ml", "amlhpc", "abcdefghij"])
    def test_derived_names_are_valid_for_any_valid_prefix_and_stack(self, prefix, stack):
        names = naming.StackNames.derive(prefix, stack, "westeurope")
        assert names.problems() == []

    def test_stable_for_the_same_stack(self):
        assert naming.StackNames.derive("amlhpc", "dev", "eastus") == naming.StackNames.derive("amlhpc", "dev", "eastus")

    def test_global_names_differ_between_stacks_and_regions(self):
        a = naming.StackNames.derive("amlhpc", "dev", "eastus")
        b = naming.StackNames.derive("amlhpc", "prod", "eastus")
        c = naming.StackNames.derive("amlhpc", "dev", "westus3")
        for field in ("dataset_storage", "key_vault", "container_registry"):
            assert len({getattr(a, field), getattr(b, field), getattr(c, field)}) == 3

    def test_truncated_stacks_stay_distinct(self):
        """Two long stack names sharing a prefix must not collide after truncation."""
        a = naming.StackNames.derive("amlhpc", "exp-sweep-aaaaaaaaaa1", "eastus")
        b = naming.StackNames.derive("amlhpc", "exp-sweep-aaaaaaaaaa2", "eastus")
        assert a.dataset_storage != b.dataset_storage and a.key_vault != b.key_vault

    def test_overrides_replace_derived_names(self):
        names = naming.StackNames.derive("amlhpc", "dev", "eastus", {"datasetStorageAccount": "mydata001"})
        assert names.dataset_storage == "mydata001"

    def test_dataset_and_workspace_storage_are_different_accounts(self):
        names = naming.StackNames.derive("amlhpc", "dev", "eastus")
        assert names.dataset_storage != names.workspace_storage
