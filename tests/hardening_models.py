"""Hold declared resources against Azure's own SDK models: every input the program sends must
be a property Azure's model knows, nested objects included, with a documented enum value.

The references are Microsoft's generated clients, not our reading of them: azure-ai-ml's
REST client for Azure ML (API 2025-12-01, the version pulumi-azure-native 3.x uses),
azure-mgmt-network, -compute and -keyvault (TypeSpec models) and azure-mgmt-monitor 6.x and
-resource-locks (msrest models). Pulumi sends a resource's `properties` flattened into its
inputs, and so do these models' constructors (their `__flattened_items`), so both sides are
compared by the same REST property names, one level of flattening at a time.

Path parameters (resource group, names, scope) are not body properties: each type lists its own.
"""

from __future__ import annotations

import enum
import importlib
import re
import typing
from dataclasses import dataclass
from typing import Any

_NoneType = type(None)


@dataclass(frozen=True)
class Reference:
    module: str
    model: str
    path_params: frozenset[str]
    style: str = "typespec"
    """typespec (azure/_utils/model_base.Model) or msrest (_serialization.Model)."""
    open_enums: frozenset[str] = frozenset()
    """Properties whose SDK enum is documented as incomplete: any string is checked as text only."""

    def cls(self) -> type:
        return getattr(importlib.import_module(self.module), self.model)


_NET = "azure.mgmt.network.models"
REFERENCES: dict[str, Reference] = {
    "azure-native:machinelearningservices:Workspace": Reference(
        "azure.ai.ml._restclient.arm_ml_service.models", "Workspace", frozenset({"resourceGroupName", "workspaceName"})),
    "azure-native:monitor:DiagnosticSetting": Reference(
        "azure.mgmt.monitor.v2021_05_01_preview.models", "DiagnosticSettingsResource", frozenset({"name", "resourceUri"}),
        "msrest"),
    "azure-native:authorization:ManagementLockByScope": Reference(
        "azure.mgmt.resource.locks.models", "ManagementLockObject", frozenset({"scope", "lockName"}), "msrest"),
    "azure-native:keyvault:Key": Reference(
        "azure.mgmt.keyvault.models", "KeyCreateParameters", frozenset({"resourceGroupName", "vaultName", "keyName"})),
    "azure-native:network:BastionHost": Reference(_NET, "BastionHost", frozenset({"resourceGroupName", "bastionHostName"})),
    "azure-native:network:Subnet": Reference(
        _NET, "Subnet", frozenset({"resourceGroupName", "virtualNetworkName", "subnetName"})),
    "azure-native:network:NetworkSecurityGroup": Reference(
        _NET, "NetworkSecurityGroup", frozenset({"resourceGroupName", "networkSecurityGroupName"})),
    "azure-native:network:PublicIPAddress": Reference(
        _NET, "PublicIPAddress", frozenset({"resourceGroupName", "publicIpAddressName"})),
    "azure-native:network:NatGateway": Reference(_NET, "NatGateway", frozenset({"resourceGroupName", "natGatewayName"})),
    "azure-native:network:NetworkInterface": Reference(
        _NET, "NetworkInterface", frozenset({"resourceGroupName", "networkInterfaceName"})),
    "azure-native:network:VirtualNetwork": Reference(
        _NET, "VirtualNetwork", frozenset({"resourceGroupName", "virtualNetworkName"})),
    "azure-native:compute:VirtualMachine": Reference(
        "azure.mgmt.compute.models", "VirtualMachine", frozenset({"resourceGroupName", "vmName"}),
        # VirtualMachineSizeTypes is frozen at 2017's sizes; its docstring points to the
        # List Sizes API for the real list.
        open_enums=frozenset({"hardwareProfile.vmSize"})),
}


def _as_rest(inputs: Any) -> Any:
    """Pulumi's own representations turned back into Azure's: azure-native takes
    `userAssignedIdentities` as a list of ids and sends Azure a map of id -> {}."""
    if isinstance(inputs, dict):
        return {k: ({i: {} for i in v} if k == "userAssignedIdentities" and isinstance(v, list) else _as_rest(v))
                for k, v in inputs.items()}
    if isinstance(inputs, list):
        return [_as_rest(v) for v in inputs]
    return inputs


def problems(type_token: str, inputs: dict[str, Any]) -> list[str]:
    """What in `inputs` the SDK model of `type_token` does not know (empty when all is known)."""
    ref = REFERENCES[type_token]
    body = {k: v for k, v in _as_rest(inputs).items() if k not in ref.path_params}
    found: list[str] = []
    if ref.style == "msrest":
        _msrest(ref.cls(), body, ref.model, found)
    else:
        _typespec(ref.cls(), body, ref.model, found)
    open_paths = tuple(f"{ref.model}.{p}:" for p in ref.open_enums)
    return [f for f in found if not (f.startswith(open_paths) and " is not one of " in f)]


# --------------------------------------------------------------------------------------
# TypeSpec models (azure/*/_utils/model_base.py)


def _flattened(cls: type) -> list[str]:
    for klass in cls.__mro__:
        items = getattr(klass, f"_{klass.__name__}__flattened_items", None)
        if items:
            return list(items)
    return []


def _hints(cls: type) -> dict[str, Any]:
    """Annotations resolved: the generated code names its package's models `_models`."""
    module = importlib.import_module(cls.__module__)
    package = importlib.import_module(cls.__module__.rsplit(".", 1)[0])
    return typing.get_type_hints(cls, globalns={**vars(module), "_models": package})


def _rest_fields(cls: type) -> dict[str, Any]:
    """The model's attribute -> REST field map (computed on a class's first instantiation)."""
    if "_attr_to_rest_field" not in cls.__dict__:
        cls.__new__(cls)
    return cls._attr_to_rest_field


def _fields(cls: type) -> dict[str, tuple[str, Any]]:
    """REST name -> (attribute, annotation), flattened `properties` included."""
    hints = _hints(cls)
    out = {rf._rest_name: (attr, hints.get(attr)) for attr, rf in _rest_fields(cls).items()}
    flattened = _flattened(cls)
    if flattened and "properties" in out:
        props_cls = _model_in(out["properties"][1])
        if props_cls is not None:
            for rest, (attr, hint) in _fields(props_cls).items():
                if attr in flattened:
                    out.setdefault(rest, (attr, hint))
    return out


def _model_in(annotation: Any) -> type | None:
    for arg in _alternatives(annotation):
        if isinstance(arg, type) and hasattr(arg, "_calculated"):
            return arg
    return None


def _alternatives(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        out: list[Any] = []
        for arg in typing.get_args(annotation):
            out += _alternatives(arg)
        return [a for a in out if a is not _NoneType]
    if isinstance(annotation, typing.ForwardRef):
        return []
    return [annotation]


def _typespec(cls: type, data: dict[str, Any], where: str, found: list[str]) -> None:
    fields = _fields(cls)
    for key, value in data.items():
        if key not in fields:
            found.append(f"{where}: {cls.__name__} has no property {key!r}")
            continue
        _value(fields[key][1], value, f"{where}.{key}", found)


def _discriminated(cls: type, value: dict[str, Any]) -> type:
    mapping = getattr(cls, "__mapping__", None) or {}
    for rf in _rest_fields(cls).values():
        if rf._is_discriminator and rf._rest_name in value:
            return mapping.get(value[rf._rest_name], cls)
    return cls


def _value(annotation: Any, value: Any, where: str, found: list[str]) -> None:
    if value is None or annotation is None:
        return
    options = _alternatives(annotation)
    model = _model_in(annotation)
    if isinstance(value, dict):
        if model is not None:
            _typespec(_discriminated(model, value), value, where, found)
            return
        mapping = next((a for a in options if typing.get_origin(a) is dict), None)
        if mapping is not None:
            inner = typing.get_args(mapping)[1]
            for k, v in value.items():
                _value(inner, v, f"{where}[{k}]", found)
            return
        if any(a is Any for a in options):
            return
        found.append(f"{where}: an object where the model wants {annotation}")
        return
    if isinstance(value, list):
        sequence = next((a for a in options if typing.get_origin(a) in (list, typing.List)), None)  # noqa: UP006
        if sequence is None:
            found.append(f"{where}: a list where the model wants {annotation}")
            return
        inner = typing.get_args(sequence)[0]
        for i, item in enumerate(value):
            _value(inner, item, f"{where}[{i}]", found)
        return
    enums = [a for a in options if isinstance(a, type) and issubclass(a, enum.Enum)]
    if enums and isinstance(value, str):
        allowed = {str(m.value).lower() for e in enums for m in e}
        if value.lower() not in allowed:
            found.append(f"{where}: {value!r} is not one of {sorted(allowed)}")
        return
    scalars = [a for a in options if a in (str, bool, int, float)]
    if scalars and not any(_fits(s, value) for s in scalars):
        found.append(f"{where}: {value!r} is not a {'/'.join(s.__name__ for s in scalars)}")


def _fits(kind: type, value: Any) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind in (int, float):  # Pulumi sends every number as a float
        return isinstance(value, (int, float)) and not isinstance(value, bool) and (kind is float or value == int(value))
    return isinstance(value, kind)


# --------------------------------------------------------------------------------------
# msrest models (_serialization.Model)


def _msrest(cls: type, data: dict[str, Any], where: str, found: list[str]) -> None:
    module = importlib.import_module(cls.__module__)
    by_rest = {re.split(r"(?<!\\)\.", spec["key"])[-1].replace("\\.", "."): spec["type"]
               for spec in cls._attribute_map.values()}
    for key, value in data.items():
        if key not in by_rest:
            found.append(f"{where}: {cls.__name__} has no property {key!r}")
            continue
        _msrest_value(module, by_rest[key], value, f"{where}.{key}", found)


def _msrest_value(module: Any, kind: str, value: Any, where: str, found: list[str]) -> None:
    if value is None:
        return
    if kind.startswith("[") and kind.endswith("]"):
        if not isinstance(value, list):
            found.append(f"{where}: not a list")
            return
        for i, item in enumerate(value):
            _msrest_value(module, kind[1:-1], item, f"{where}[{i}]", found)
    elif kind.startswith("{") and kind.endswith("}"):
        for k, v in (value or {}).items():
            _msrest_value(module, kind[1:-1], v, f"{where}[{k}]", found)
    elif hasattr(module, kind) and isinstance(value, dict):
        _msrest(getattr(module, kind), value, where, found)
    elif kind == "bool" and not isinstance(value, bool):
        found.append(f"{where}: {value!r} is not a bool")
    elif kind == "str" and not isinstance(value, str):
        found.append(f"{where}: {value!r} is not a str")
