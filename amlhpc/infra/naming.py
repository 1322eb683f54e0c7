"""Physical Azure names: built and checked in one place.

Pulumi's logical names (the URN) are identity; renaming one needs `aliases`. Physical
names follow Azure's per-type rules, and some are global (storage accounts, key vaults,
container registries, ML registries), so derived names end in the stack's random
`aml-hpc:nameSuffix` (generated once by the tooling and kept in the stack file; a hash of
prefix, stack and location stands in until then).
Users can override a derived name in the stack file (`aml-hpc:names`); every name, derived
or given, goes through `check()`.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any, Literal

NameKind = Literal[
    "namePrefix",
    "nameSuffix",
    "resourceGroup",
    "storageAccount",
    "keyVault",
    "containerRegistry",
    "workspace",
    "mlRegistry",
    "cluster",
    "logAnalytics",
    "appInsights",
    "identity",
    "virtualNetwork",
    "budget",
]


@dataclass(frozen=True)
class NameRule:
    min_len: int
    max_len: int
    pattern: str
    allowed: str
    """Human wording of the rule, for error messages."""
    globally_unique: bool = False


RULES: dict[NameKind, NameRule] = {
    "namePrefix": NameRule(2, 10, r"^[a-z][a-z0-9]*$", "2-10 lowercase letters and digits, starting with a letter"),
    "nameSuffix": NameRule(4, 8, r"^[a-z0-9]+$", "4-8 lowercase letters and digits"),
    "resourceGroup": NameRule(1, 90, r"^[-\w().]*[-\w()]$", "1-90 letters, digits, '_', '-', '.', '(' or ')', not ending in '.'"),
    "storageAccount": NameRule(3, 24, r"^[a-z0-9]+$", "3-24 lowercase letters and digits, unique across Azure", True),
    "keyVault": NameRule(3, 24, r"^[a-zA-Z](?!.*--)[a-zA-Z0-9-]*[a-zA-Z0-9]$", "3-24 letters, digits and single hyphens, starting with a letter and ending with a letter or digit, unique across Azure", True),
    "containerRegistry": NameRule(5, 50, r"^[a-zA-Z0-9]+$", "5-50 letters and digits, unique across Azure", True),
    # azure-ai-ml's workspace data-plane client checks ^[a-zA-Z0-9][a-zA-Z0-9_-]{2,32}$ (ASCII).
    "workspace": NameRule(3, 33, r"^[a-zA-Z0-9][a-zA-Z0-9_-]*$", "3-33 ASCII letters, digits, '-' or '_', starting with a letter or digit"),
    # REST specification (machinelearningservices 2025-12-01, registries.json,
    # RegistryNameParameter): ^[a-zA-Z0-9][a-zA-Z0-9\-_]{2,32}$; Microsoft's registry
    # documentation caps the name at 32 characters. We enforce both: 3-32, ASCII.
    "mlRegistry": NameRule(3, 32, r"^[a-zA-Z0-9][a-zA-Z0-9_-]*$", "3-32 ASCII letters, digits, '-' or '_', starting with a letter or digit, unique across Azure", True),
    # Microsoft Learn, "Create compute clusters" (checked 2026-11-23): 3-24 characters,
    # letters, digits and '-', starting with a letter; a '-' must be followed by at least one
    # letter later in the name. (The resource naming rules allow 3-32 for AmlCompute.)
    "cluster": NameRule(3, 24, r"^[a-zA-Z][a-zA-Z0-9-]*$", "3-24 letters, digits and hyphens, starting with a letter, with a letter somewhere after the last hyphen (sweep-v2, not sweep-2)"),
    "logAnalytics": NameRule(4, 63, r"^[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]$", "4-63 letters, digits and hyphens, starting and ending with a letter or digit"),
    "appInsights": NameRule(1, 255, r"^[^%&\\?/]+$", "1-255 characters without %, &, \\, ? or /"),
    "identity": NameRule(3, 128, r"^[a-zA-Z0-9][\w-]*$", "3-128 letters, digits, '-' or '_', starting with a letter or digit"),
    "virtualNetwork": NameRule(2, 64, r"^[a-zA-Z0-9][\w.-]*\w$", "2-64 letters, digits, '_', '.', '-', starting with a letter or digit"),
    "budget": NameRule(1, 63, r"^[\w-]+$", "1-63 letters, digits, '-' or '_'"),
}


def check(kind: NameKind, value: str) -> str | None:
    """Why `value` is not a valid `kind` name, or None if it is."""
    rule = RULES[kind]
    if not isinstance(value, str) or not value:
        return f"must be {rule.allowed}"
    if not rule.min_len <= len(value) <= rule.max_len:
        return f"{value!r} is {len(value)} characters long; must be {rule.allowed}"
    if not re.fullmatch(rule.pattern, value):
        return f"{value!r} has characters Azure does not allow here; must be {rule.allowed}"
    if kind == "cluster" and not compute_hyphen_rule_ok(value):
        return f"{value!r} has no letter after its last hyphen; must be {rule.allowed}"
    return None


def compute_hyphen_rule_ok(name: str) -> bool:
    """Azure ML compute names: a hyphen must be followed by at least one letter later."""
    return "-" not in name or re.search(r"[A-Za-z]", name[name.rindex("-"):]) is not None


def _slug(text: str) -> str:
    """Lowercase letters and digits only."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


SUFFIX_LETTERS = "abcdefghijklmnopqrstuvwxyz"
SUFFIX_ALPHABET = SUFFIX_LETTERS + "0123456789"
SUFFIX_LENGTH = 6
"""26 x 36**5 (about 1.6e9) suffixes: two deployments of this repository pick the same one
with odds of about 1 in 1.6 billion."""


def random_suffix() -> str:
    """A fresh per-stack name suffix (generated once, then kept in the stack file).

    It starts with a letter: YAML reads `123456` or `0x1f2e` as a number, and the stack file
    and Pulumi's config are YAML."""
    rest = "".join(secrets.choice(SUFFIX_ALPHABET) for _ in range(SUFFIX_LENGTH - 1))
    return secrets.choice(SUFFIX_LETTERS) + rest


def uniqueness_suffix(*parts: str, length: int = 5) -> str:
    """Short, stable hex hash of `parts`: the same stack always gets the same names."""
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length]


@dataclass(frozen=True)
class StackNames:
    """Every physical name one stack uses. Build with `derive()`; override per key."""

    resource_group: str
    dataset_storage: str
    workspace_storage: str
    key_vault: str
    container_registry: str
    workspace: str
    ml_registry: str
    log_analytics: str
    app_insights: str
    identity: str
    virtual_network: str
    budget: str
    coordination_storage: str = ""
    """The coordination account (aml-hpc:storage.coordinationAccount)."""
    checkpoint_storage: tuple[str, ...] = ()
    """The stack's own checkpoint accounts, in striping order (aml-hpc:checkpointAccounts)."""

    # stack-file key (aml-hpc:names.<key>) -> (field, kind)
    OVERRIDABLE = {
        "resourceGroup": ("resource_group", "resourceGroup"),
        "datasetStorageAccount": ("dataset_storage", "storageAccount"),
        "workspaceStorageAccount": ("workspace_storage", "storageAccount"),
        "keyVault": ("key_vault", "keyVault"),
        "containerRegistry": ("container_registry", "containerRegistry"),
        "workspace": ("workspace", "workspace"),
        "mlRegistry": ("ml_registry", "mlRegistry"),
    }

    @classmethod
    def derive(cls, prefix: str, stack: str, location: str, overrides: dict[str, str] | None = None,
               suffix: str | None = None, checkpoint_accounts: int = 0) -> StackNames:
        """Names from prefix, stack and location, with `overrides` (stack-file keys) applied.

        `suffix` is the stack's random aml-hpc:nameSuffix: every globally unique name ends in
        it, so no two deployments of this repository collide. Without it (offline plans of a
        stack file nobody has deployed yet) a hash of prefix, stack and location stands in.
        """
        suffix = suffix or uniqueness_suffix(prefix, stack, location)
        stack_slug = _slug(stack)
        short = f"{prefix[:8]}{stack_slug[:7]}"
        derived: dict[str, Any] = dict(
            resource_group=f"rg-{prefix}-{stack}",
            dataset_storage=f"{short}ds{suffix}"[:24],
            workspace_storage=f"{short}ws{suffix}"[:24],
            key_vault=_key_vault_name(prefix, stack, suffix),
            container_registry=f"{prefix}{stack_slug[:20]}acr{suffix}",
            workspace=f"mlw-{prefix}-{stack}"[:33].rstrip("-_"),
            ml_registry=f"{f'mlr-{prefix}-{stack}'[: 31 - len(suffix)].rstrip('-_')}-{suffix}",
            log_analytics=f"log-{prefix}-{stack}"[:63],
            app_insights=f"appi-{prefix}-{stack}",
            identity=f"id-{prefix}-{stack}-compute",
            virtual_network=f"vnet-{prefix}-{stack}",
            budget=f"budget-{prefix}-{stack}"[:63],
            coordination_storage=_account_name(short, "co", suffix),
            checkpoint_storage=tuple(_account_name(short, f"ck{i}", suffix) for i in range(1, checkpoint_accounts + 1)),
        )
        for key, value in (overrides or {}).items():
            field_name, _ = cls.OVERRIDABLE[key]
            derived[field_name] = value
        return cls(**derived)

    def problems(self) -> list[tuple[str, str]]:
        """(field, message) for every name that breaks its rule."""
        kinds = {
            "resource_group": "resourceGroup",
            "dataset_storage": "storageAccount",
            "workspace_storage": "storageAccount",
            "key_vault": "keyVault",
            "container_registry": "containerRegistry",
            "workspace": "workspace",
            "ml_registry": "mlRegistry",
            "log_analytics": "logAnalytics",
            "app_insights": "appInsights",
            "identity": "identity",
            "virtual_network": "virtualNetwork",
            "budget": "budget",
        }
        out = []
        for field_name, kind in kinds.items():
            message = check(kind, getattr(self, field_name))  # type: ignore[arg-type]
            if message:
                out.append((field_name, message))
        for field_name, value in (("coordination_storage", self.coordination_storage),
                                  *(("checkpoint_storage", name) for name in self.checkpoint_storage)):
            message = check("storageAccount", value) if value else None
            if message:
                out.append((field_name, message))
        return out


def _account_name(short: str, role: str, suffix: str) -> str:
    """A role account's name: the stack's short stem, the role's tag and the suffix, within 24 characters."""
    return f"{short[: 24 - len(role) - len(suffix)]}{role}{suffix}"


def _key_vault_name(prefix: str, stack: str, suffix: str) -> str:
    body = re.sub(r"-+", "-", f"kv-{prefix}-{_slug(stack)}")[: 24 - len(suffix) - 1].rstrip("-")
    return f"{body}-{suffix}"
