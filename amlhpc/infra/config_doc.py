"""The stack config's keys as documentation, generated from the config model (amlhpc.infra.config):
`python -m amlhpc.infra config-keys` prints them, `--markdown` as the README's table, `--update
README.md` rewrites that table in place. tests/test_readme.py fails when the README's table is
not what the model gives, so a key added to the model shows up in the docs or in a red test.

Every top-level key of `_RawConfig` (`aml-hpc:<key>`) is a row: its type (a nested model as
the list of its keys), its default, and what it means - the field's docstring in amlhpc/infra/config/models.py
(the string under it), else the nested model's class docstring, else MEANING below. A key with
none of them is printed as undocumented, which the test refuses.
"""

from __future__ import annotations

import ast
import inspect
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from amlhpc.infra import config

START = "<!-- config-table: generated from amlhpc/infra/config/models.py by `python -m amlhpc.infra config-keys --update README.md` -->"
END = "<!-- /config-table -->"
UNDOCUMENTED = "UNDOCUMENTED"

MEANING = {
    "location": "Azure region of every resource (`azure-native:location`)",
    "owner": "owner tag on every resource (with `environment`, `stack`, `costCenter`, `expiresAt`)",
    "costCenter": "cost-center tag on every resource",
    "namePrefix": "2-10 lowercase letters/digits; physical names are derived from it (amlhpc/infra/naming.py)",
    "environment": "experiment stacks: the environment stack they join",
    "environmentStack": "experiment stacks: the environment's fully qualified stack (`organization/aml-hpc/dev`)",
    "network": "isolation (`public`, `private`: own VNet, `managed`: Azure ML's managed VNet), address space, "
               "outbound rules and the way in (docs/isolation.md)",
    "storage": ("the dataset account: tier, shared keys (off), soft delete, egress/ingress caps, who may upload; "
                "`coordinationAccount: true` moves the `supervision` container to an account of its own"),
    "checkpointAccounts": ("checkpoint accounts of the stack's own, striped in order: `count`, or derived from the "
                           "checkpoint's size (environment or experiment stacks; [docs/deploying.md]"
                           "(docs/deploying.md#storage-accounts-by-role))"),
    "clusters": "the GPU clusters (amlhpc/core/catalog/skus.toml sizes); minNodes above 0 needs allowIdleNodes, several "
                "nodes of a size without InfiniBand allowTcpMultiNode",
    "budget": "monthly budget with alert emails and thresholds (percent)",
    "mlRegistry": "an Azure ML registry to share environments across workspaces and regions",
    "controller": "the small CPU cluster managed runs' controllers run on (docs/managed-jobs.md)",
    "expiresAt": "experiment stacks: when the teardown workflow destroys them (ISO 8601)",
    "protectData": "protect the dataset storage from deletion (default: true except on dev)",
    "prices": "your negotiated $/node-hour per VM size (overrides the catalog's reference prices)",
    "names": "physical names set one by one, overriding those derived from namePrefix",
    "encryption": "customer-managed key for the workspace (a Key Vault key), set when it is created",
    "diagnostics": "diagnostic settings of the workspace, Key Vault and storage to Log Analytics",
    "hbiWorkspace": "high business impact workspace: Microsoft collects less diagnostic data and encrypts more; set "
                    "when the workspace is created",
    "locks": "CanNotDelete locks (the dataset account's defaults to protectData)",
    "nameSuffix": "random characters every globally unique name ends in; written once by the first preview/up "
                  "(commit it, never copy another team's)",
    "workspaceStorageAuth": "how the workspace reaches its own storage: `identity` (no keys) or `accessKey`",
    "submitters": "people, groups and CI identities that may submit jobs (the aml-hpc job submitter role on the "
                  "workspace and the run records they need): without one nobody can submit under the default "
                  "`workspaceStorageAuth: identity` (the code upload needs a storage data role Owner and Contributor "
                  "lack); under `accessKey`, the workspace's Owners and Contributors can",
}
"""What a key means, where amlhpc/infra/config/models.py has no docstring for it."""


@dataclass(frozen=True)
class KeyDoc:
    key: str
    type: str
    default: str
    meaning: str

    def to_json(self) -> dict[str, str]:
        return {"key": self.key, "type": self.type, "default": self.default, "meaning": self.meaning}


def _attribute_docs(model: type[BaseModel]) -> dict[str, str]:
    """{field: the docstring written under it} from the class's source."""
    try:
        tree = ast.parse(inspect.getsource(model))
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node, after in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (`X | None`, `list[X]`...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models(arg)]


def _type(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Annotated:  # a checked number reads as the number
        return _type(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        parts = [a for a in get_args(annotation) if a is not type(None)]
        return " | ".join(_type(a) for a in parts)
    if origin is Literal:
        return " \\| ".join(f"`{v}`" for v in get_args(annotation))
    if origin in (list, tuple):
        return f"list of {_type(get_args(annotation)[0])}"
    if origin is dict:
        key, value = get_args(annotation)
        return f"map {_type(key)} -> {_type(value)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        keys = [f.alias or n for n, f in annotation.model_fields.items()]
        return "{" + ", ".join(keys) + "}"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel) or value in ({}, [], None):
        return "-"
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def keys() -> list[KeyDoc]:
    """Every key of a stack file, in the model's order (the location first)."""
    raw = config._RawConfig
    docs = _attribute_docs(raw)
    rows = [KeyDoc(config.LOCATION_KEY, "Azure region name", "required", MEANING["location"])]
    for name, field in raw.model_fields.items():
        alias = field.alias or name
        nested = _models(field.annotation)
        meaning = docs.get(name) or MEANING.get(alias) or (nested[0].__doc__ or "").strip().split("\n\n")[0]
        rows.append(KeyDoc(f"{config.NAMESPACE}{alias}", _type(field.annotation), _default(field),
                           " ".join(meaning.split()) or UNDOCUMENTED))
    return rows


def markdown() -> str:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for k in keys():
        lines.append(f"| `{k.key}` | {k.type.replace('|', '&#124;') if '`' not in k.type else k.type} | {k.default} | "
                     f"{k.meaning} |")
    return "\n".join(lines) + "\n"


def section() -> str:
    return f"{START}\n{markdown()}{END}"


def current_in(text: str) -> str | None:
    """The generated section as `text` holds it, or None when it has none."""
    if START not in text or END not in text:
        return None
    return text[text.index(START):text.index(END) + len(END)]


def update(path: Path) -> bool:
    """Rewrite the section in `path`; True when it changed."""
    text = path.read_text()
    found = current_in(text)
    if found is None:
        raise ValueError(f"{path} has no config table markers ({START} ... {END})")
    new = text.replace(found, section())
    if new != text:
        path.write_text(new)
    return new != text
