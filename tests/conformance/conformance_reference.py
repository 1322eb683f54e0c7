"""Check a resource's inputs, as azure-native sends them, against Azure's own SDK models.

Azure's management SDKs are generated from the REST specifications in two styles, and
both are read here through one view (`model_spec`):
- msrest (autorest): `_attribute_map` gives each attribute's wire key (a dotted key such as
  `properties.accessTier` is a flattened property) and type, `_validation` the required,
  read-only and constraint rules (min/max length, pattern, minimum/maximum, items),
  `_subtype_map` the polymorphic subtypes; enum types come from the `__init__` annotations
  (`Union[str, "_models.Kind"]`).
- TypeSpec: `rest_field`s give wire names and visibility (read-only when only "read"),
  class annotations the types (Optional or not: required), `__flattened_items` the
  properties flattened from `properties`, `__mapping__` the discriminated subtypes. These
  models carry no length, pattern or range rules.

azure-native flattens the same `properties` the SDKs flatten (both follow the spec's
x-ms-client-flatten and x-ms-client-name), so an input `accessTier` is the SDK attribute
`access_tier` whose wire key says where it goes in the ARM body. Names are matched
ignoring case and underscores (publicIPAllocationMethod ~ public_ip_allocation_method).

Path parameters (resource names) are checked by the SDK's own request builder, which
validates them with the specification's length and pattern rules (msrest `Serializer.url`).
"""

from __future__ import annotations

import enum
import functools
import importlib
import inspect
import re
from dataclasses import dataclass, field
from typing import Any

SCALARS = {"str": str, "int": int, "float": (int, float), "bool": bool, "object": object, "duration": str,
           "iso-8601": str, "date": str, "bytearray": str, "long": int}


def norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@dataclass(frozen=True)
class FieldSpec:
    attr: str
    wire: str
    kind: str
    """model, list, dict, enum or scalar"""
    target: Any = None
    """the nested model class, the enum class, or the scalar type name"""
    item_kind: str = ""
    """for list/dict: the kind of each item (model, enum or scalar)"""
    required: bool = False
    readonly: bool = False
    rules: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelSpec:
    cls: type
    fields: dict[str, FieldSpec]
    discriminator: str | None
    """wire name of the discriminator property, on polymorphic bases"""
    subtypes: dict[str, type]


# --------------------------------------------------------------------------------------
# Reading the models


def _models_module(cls: type):
    return importlib.import_module(cls.__module__.rsplit(".", 1)[0]) if "._" in cls.__module__ else \
        importlib.import_module(cls.__module__)


def _enum_from_annotation(cls: type, annotation: Any) -> type | None:
    text = annotation if isinstance(annotation, str) else repr(annotation)
    module = _models_module(cls)
    for name in re.findall(r"_models\.(\w+)", text):
        candidate = getattr(module, name, None)
        if isinstance(candidate, type) and issubclass(candidate, enum.Enum):
            return candidate
    return None


def _is_msrest(cls: type) -> bool:
    return "_attribute_map" in {k for c in cls.__mro__ for k in c.__dict__}


@functools.cache
def model_spec(cls: type) -> ModelSpec:
    return _msrest_spec(cls) if _is_msrest(cls) else _typespec_spec(cls)


def _msrest_type(cls: type, type_name: str) -> tuple[str, Any, str]:
    """(kind, target, item_kind) from an _attribute_map type string."""
    module = _models_module(cls)
    if type_name.startswith("[") or type_name.startswith("{"):
        kind = "list" if type_name.startswith("[") else "dict"
        inner_kind, inner, _ = _msrest_type(cls, type_name[1:-1])
        return kind, inner, inner_kind
    if type_name in SCALARS:
        return "scalar", type_name, ""
    target = getattr(module, type_name, None)
    if isinstance(target, type) and issubclass(target, enum.Enum):
        return "enum", target, ""
    if isinstance(target, type):
        return "model", target, ""
    return "scalar", "object", ""


def _msrest_spec(cls: type) -> ModelSpec:
    try:
        annotations = {k: p.annotation for k, p in inspect.signature(cls.__init__).parameters.items()}
    except (TypeError, ValueError):
        annotations = {}
    validation = getattr(cls, "_validation", {}) or {}
    fields = {}
    for attr, info in cls._attribute_map.items():
        kind, target, item_kind = _msrest_type(cls, info["type"])
        rules = dict(validation.get(attr, {}))
        if kind == "scalar" and target == "str":
            found = _enum_from_annotation(cls, annotations.get(attr, ""))
            if found is not None:
                kind, target = "enum", found
        fields[norm(attr)] = FieldSpec(attr, info["key"], kind, target, item_kind,
                                       bool(rules.pop("required", False)), bool(rules.pop("readonly", False)), rules)
    subtypes: dict[str, type] = {}
    discriminator = None
    for attr, mapping in (getattr(cls, "_subtype_map", None) or {}).items():
        discriminator = cls._attribute_map[attr]["key"]
        module = _models_module(cls)
        subtypes = {value: getattr(module, name) for value, name in mapping.items() if hasattr(module, name)}
    return ModelSpec(cls, fields, discriminator, subtypes)


def _typespec_rest_fields(cls: type) -> tuple[dict[str, Any], dict[str, Any]]:
    rest, annotations = {}, {}
    for klass in reversed(cls.__mro__):
        for key, value in klass.__dict__.items():
            if key[0] != "_" and hasattr(value, "_type") and hasattr(value, "_rest_name_input"):
                rest[key] = value
        annotations.update(getattr(klass, "__annotations__", {}) or {})
    return rest, annotations


def _strip_optional(text: str) -> tuple[str, bool]:
    text = text.replace("typing.", "").replace("ForwardRef(", "(").strip()
    if text.startswith("Optional[") and text.endswith("]"):
        return text[len("Optional["):-1].strip(), True
    if text.startswith("Union[") and text.endswith(", NoneType]"):
        return text[len("Union["):-len(", NoneType]")].strip(), True
    return text, False


def _typespec_type(cls: type, annotation: Any) -> tuple[str, Any, str, bool]:
    """(kind, target, item_kind, optional) from a TypeSpec annotation (a string or a typing object)."""
    inner, optional = _strip_optional(annotation if isinstance(annotation, str) else repr(annotation))
    inner = inner.strip("'\"")
    module = _models_module(cls)
    for kind, prefix in (("list", "list["), ("list", "List["), ("dict", "dict[str, "), ("dict", "Dict[str, ")):
        if inner.startswith(prefix) and inner.endswith("]"):
            item_kind, target, _, _ = _typespec_type(cls, inner[len(prefix):-1])
            return kind, target, item_kind, optional
    enum_cls = _enum_from_annotation(cls, inner)
    if enum_cls is not None:
        return "enum", enum_cls, "", optional
    names = re.findall(r"_models\.(\w+)", inner)
    if names and isinstance(getattr(module, names[0], None), type):
        return "model", getattr(module, names[0]), "", optional
    for scalar in ("str", "int", "float", "bool"):
        if re.fullmatch(rf"{scalar}|<class '{scalar}'>", inner):
            return "scalar", scalar, "", optional
    return "scalar", "object", "", optional


def _typespec_spec(cls: type) -> ModelSpec:
    rest, annotations = _typespec_rest_fields(cls)
    fields: dict[str, FieldSpec] = {}
    discriminator = None
    for attr, rf in rest.items():
        kind, target, item_kind, optional = _typespec_type(cls, annotations.get(attr, "object"))
        wire = rf._rest_name_input or attr  # noqa: SLF001 - the model's own metadata
        visibility = rf._visibility or []  # noqa: SLF001
        if rf._is_discriminator:  # noqa: SLF001
            discriminator = wire
        fields[norm(attr)] = FieldSpec(attr, wire, kind, target, item_kind, required=not optional,
                                       readonly=visibility == ["read"])
    flattened = next((v for k, v in vars(cls).items() if k.endswith("__flattened_items")), None)
    if flattened and "properties" in fields and fields["properties"].kind == "model":
        inner = model_spec(fields["properties"].target)
        for name in flattened:
            spec = inner.fields.get(norm(name))
            if spec is not None:
                fields[norm(name)] = FieldSpec(spec.attr, f"properties.{spec.wire}", spec.kind, spec.target,
                                               spec.item_kind, spec.required, spec.readonly, spec.rules)
    subtypes = dict(getattr(cls, "__mapping__", {}) or {})
    return ModelSpec(cls, fields, discriminator, subtypes)


# --------------------------------------------------------------------------------------
# Checking values


@dataclass
class Finding:
    path: str
    message: str


def _matches_pattern(pattern: str, value: str) -> bool:
    # msrest Serializer.validate: a value fails "pattern" when re.match finds nothing.
    return re.match(pattern, value, re.UNICODE) is not None


def check_rules(value: Any, rules: dict[str, Any], path: str, out: list[Finding]) -> None:
    """The msrest `_validation` rules Serializer.validate applies."""
    if isinstance(value, str):
        if "max_length" in rules and len(value) > rules["max_length"]:
            out.append(Finding(path, f"{value!r} is longer than {rules['max_length']} characters"))
        if "min_length" in rules and len(value) < rules["min_length"]:
            out.append(Finding(path, f"{value!r} is shorter than {rules['min_length']} characters"))
        if "pattern" in rules and not _matches_pattern(rules["pattern"], value):
            out.append(Finding(path, f"{value!r} does not match {rules['pattern']}"))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "maximum" in rules and value > rules["maximum"]:
            out.append(Finding(path, f"{value} is above the maximum {rules['maximum']}"))
        if "minimum" in rules and value < rules["minimum"]:
            out.append(Finding(path, f"{value} is below the minimum {rules['minimum']}"))
        if "exclusive_maximum" in rules and value >= rules["exclusive_maximum"]:
            out.append(Finding(path, f"{value} is not below {rules['exclusive_maximum']}"))
        if "exclusive_minimum" in rules and value <= rules["exclusive_minimum"]:
            out.append(Finding(path, f"{value} is not above {rules['exclusive_minimum']}"))
    if isinstance(value, list):
        if "max_items" in rules and len(value) > rules["max_items"]:
            out.append(Finding(path, f"{len(value)} items, at most {rules['max_items']}"))
        if "min_items" in rules and len(value) < rules["min_items"]:
            out.append(Finding(path, f"{len(value)} items, at least {rules['min_items']}"))


def _resolve_polymorphic(spec: ModelSpec, value: dict[str, Any], path: str, out: list[Finding]) -> ModelSpec:
    if not spec.discriminator or not spec.subtypes:
        return spec
    wire = spec.discriminator.rsplit(".", 1)[-1]
    chosen = next((v for k, v in value.items() if norm(k) == norm(wire)), None)
    if chosen is None:
        out.append(Finding(f"{path}.{wire}" if path else wire, f"the discriminator of {spec.cls.__name__} is missing"))
        return spec
    sub = spec.subtypes.get(chosen) or next((c for k, c in spec.subtypes.items() if k.lower() == str(chosen).lower()), None)
    if sub is None:
        out.append(Finding(f"{path}.{wire}" if path else wire,
                           f"{chosen!r} is not one of {sorted(spec.subtypes)} ({spec.cls.__name__})"))
        return spec
    return model_spec(sub)


def _covered(path: str, skip: dict[str, str]) -> bool:
    generic = re.sub(r"\[\d+\]", "[*]", path)
    return any(generic == p or generic.startswith(p + ".") for p in skip)


def check_model(value: dict[str, Any], cls: type, path: str, skip: dict[str, str], out: list[Finding],
                exclude: set[str] = frozenset()) -> None:
    """Every key of `value` is a writable property of `cls` with a valid value, and every
    required property is there. `exclude`: normalized top-level names checked elsewhere
    (path parameters). `skip`: input paths the row lists as not covered, with why."""
    spec = _resolve_polymorphic(model_spec(cls), value, path, out)
    present = set()
    for key, inner in value.items():
        if norm(key) in exclude:
            continue
        where = f"{path}.{key}" if path else key
        present.add(norm(key))
        if _covered(where, skip):
            continue
        found = spec.fields.get(norm(key))
        if found is not None and found.wire.startswith("properties.") and "properties" in spec.fields:
            present.add("properties")  # a flattened property: the `properties` object is there
        if found is None:
            out.append(Finding(where, f"{spec.cls.__name__} has no property {key!r}"))
        elif found.readonly:
            out.append(Finding(where, f"read-only in {spec.cls.__name__}: Azure sets it, a request must not"))
        else:
            check_value(inner, found, where, skip, out)
    for name, found in spec.fields.items():
        if found.required and not found.readonly and name not in present and name not in exclude:
            where = f"{path}.{found.attr}" if path else found.attr
            if not _covered(where, skip):
                out.append(Finding(where, f"required by {spec.cls.__name__} but not set"))


def check_value(value: Any, spec: FieldSpec, path: str, skip: dict[str, str], out: list[Finding]) -> None:
    if value is None:
        return
    check_rules(value, spec.rules, path, out)
    if spec.kind in ("list", "dict"):
        container = list if spec.kind == "list" else dict
        if not isinstance(value, container):
            out.append(Finding(path, f"expected a {spec.kind}, got {type(value).__name__}"))
            return
        items = enumerate(value) if spec.kind == "list" else value.items()
        for key, item in items:
            inner = FieldSpec(spec.attr, spec.wire, spec.item_kind, spec.target)
            check_value(item, inner, f"{path}[{key}]" if spec.kind == "list" else f"{path}.{key}", skip, out)
    elif spec.kind == "model":
        if not isinstance(value, dict):
            out.append(Finding(path, f"expected an object ({spec.target.__name__}), got {type(value).__name__}"))
            return
        check_model(value, spec.target, path, skip, out)
    elif spec.kind == "enum":
        allowed = [e.value for e in spec.target]
        # msrest's Serializer.serialize_enum accepts a value in any case.
        if not isinstance(value, str) or value.lower() not in {a.lower() for a in allowed}:
            out.append(Finding(path, f"{value!r} is not one of {allowed} ({spec.target.__name__})"))
    elif spec.kind == "scalar" and spec.target in SCALARS and SCALARS[spec.target] is not object:
        if spec.target in ("int", "long") and isinstance(value, float) and value.is_integer():
            return  # Pulumi carries every number as a double; azure-native sends the schema's integer
        if not isinstance(value, SCALARS[spec.target]) or (spec.target != "bool" and isinstance(value, bool)):
            out.append(Finding(path, f"expected {spec.target}, got {type(value).__name__} {value!r}"))


def check_path_parameters(builder: Any, inputs: dict[str, Any], defaults: dict[str, str], out: list[Finding]) -> set[str]:
    """Call the SDK's request builder with the resource's names: it raises on a name the
    specification's rules refuse. Returns the normalized input names used as parameters."""
    kwargs, used = {}, set()
    for name, param in inspect.signature(builder).parameters.items():
        if param.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            continue
        key = next((k for k in inputs if norm(k) == norm(name)), None)
        if key is not None:
            kwargs[name] = str(inputs[key])
            used.add(norm(key))
        elif name in defaults:
            kwargs[name] = defaults[name]
        else:
            out.append(Finding(name, f"path parameter {name!r} has no input"))
            return used
    module_globals = builder.__globals__
    real = module_globals.get("_SERIALIZER")
    if real is not None:
        # The builder hands each name to _SERIALIZER.url with the specification's rules
        # (max_length, min_length, pattern); generated serializers no longer enforce them,
        # so a stand-in applies them as msrest's Serializer.validate did.
        module_globals["_SERIALIZER"] = _RuleCheckingSerializer(real, out)
    try:
        builder(**kwargs)
    except (ValueError, TypeError) as exc:
        out.append(Finding(",".join(sorted(kwargs)), f"a name Azure refuses: {exc}"))
    finally:
        if real is not None:
            module_globals["_SERIALIZER"] = real
    return used


class _RuleCheckingSerializer:
    """Wraps a generated Serializer: url() checks the rules the builder passes along."""

    RULES = ("max_length", "min_length", "pattern", "maximum", "minimum", "max_items", "min_items")

    def __init__(self, real: Any, out: list[Finding]):
        self.real = real
        self.out = out

    def url(self, name: str, data: Any, data_type: str, **kwargs: Any) -> str:
        rules = {k: kwargs.pop(k) for k in self.RULES if k in kwargs}
        found: list[Finding] = []
        check_rules(data, rules, name, found)
        self.out.extend(Finding(f.path, f"a name Azure refuses: {f.message}") for f in found)
        return self.real.url(name, data, data_type, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def api_version_of(builder: Any, defaults: dict[str, str]) -> str:
    """The API version the SDK builder puts on the request."""
    kwargs = {name: defaults.get(name, "x") for name, p in inspect.signature(builder).parameters.items()
              if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD}
    kwargs = {k: ("/subscriptions/x" if k == "scope" else v) for k, v in kwargs.items()}
    return re.search(r"api-version=([0-9a-z-]+)", builder(**kwargs).url).group(1)


def arm_shape(value: Any) -> Any:
    """azure-native's own input conventions, turned into the ARM shape the models describe:
    `userAssignedIdentities` is a list of identity ids in azure-native (v2 and later) and the
    {id: {}} map in ARM; the provider converts one into the other."""
    if isinstance(value, dict):
        out = {}
        for key, inner in value.items():
            if key == "userAssignedIdentities" and isinstance(inner, list):
                out[key] = {identity: {} for identity in inner}
            else:
                out[key] = arm_shape(inner)
        return out
    if isinstance(value, list):
        return [arm_shape(v) for v in value]
    return value


def resolve(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)

