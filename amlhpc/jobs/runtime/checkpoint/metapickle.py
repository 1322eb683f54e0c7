"""A pure-Python unpickler for torch.distributed.checkpoint (DCP) `.metadata` files that builds
plain records and nothing else.

`pickle.Unpickler` restricted through `find_class` still runs BUILD as pickle defines it: a
`(state, slotstate)` pair becomes `setattr` on whatever object is on the stack, and an
allow-listed global is such an object. A forged `.metadata` could therefore patch a class or
function of the restoring process (pathlib.PurePosixPath.__truediv__, Metadata itself,
torch.serialization._get_layout.cache) before the load was refused, changing what later code
does. torch's own weights_only unpickler refuses protocol 4's FRAME, which DCP writes, so it
is no drop-in either.

Here the opcodes are read with the standard library's `pickletools.genops` (which only
decodes) and interpreted by this module, which knows what DCP metadata consists of
(torch 2.13, torch/distributed/checkpoint/metadata.py and filesystem.py):

- records (Metadata, TensorStorageMetadata, ChunkStorageMetadata, BytesStorageMetadata,
  TensorProperties, MetadataIndex, StorageMeta, _StorageInfo) are made only by NEWOBJ with no
  arguments and filled only by one BUILD on that fresh instance, with attribute names from the
  record's own fields and values of the field's types; nothing else is ever set on anything;
- the callables a DCP pickle calls (torch.Size, the layout and memory-format lookups, paths,
  OrderedDict) are never called as found: each maps to a function of this module that builds
  the value from plain arguments (`_get_layout` is answered from our own table, so even its
  cache is untouched);
- dtypes are values; every other global, every other opcode (INST, OBJ, NEWOBJ_EX,
  extension codes, persistent ids, buffers) is refused with UnsafeCheckpoint naming it.

A refused file leaves no trace in the process: no class, function or module was touched.
Imports torch lazily: used by the training process, never by the launcher.
"""

from __future__ import annotations

import dataclasses
import importlib
import pickletools
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any

from amlhpc.jobs.runtime.checkpoint import safepath
from amlhpc.jobs.runtime.checkpoint.errors import CheckpointError, UnsafeCheckpoint

_META = "torch.distributed.checkpoint.metadata"
_FS = "torch.distributed.checkpoint.filesystem"
RECORDS = (
    (_META, "Metadata"), (_META, "TensorStorageMetadata"), (_META, "ChunkStorageMetadata"),
    (_META, "BytesStorageMetadata"), (_META, "TensorProperties"), (_META, "MetadataIndex"),
    (_META, "StorageMeta"), (_FS, "_StorageInfo"),
)
"""The classes a DCP `.metadata` builds instances of (NEWOBJ, then BUILD)."""
CALLABLES = (("torch", "Size"), ("torch.serialization", "_get_layout"), (_META, "_MEM_FORMAT_ENCODING"),
             ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("collections", "OrderedDict"))
"""The globals a DCP `.metadata` calls (REDUCE); each is answered by a function here."""

_NONE = type(None)


class _Global:
    """A global the pickle named: never the object itself until a rule here says what to do."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __repr__(self) -> str:
        return f"{self.module}.{self.name}"


class _Mark:
    __slots__ = ()


_MARK = _Mark()


class MetadataUnpickler:
    """Interprets one `.metadata` pickle (see the module docstring); `load()` returns its object."""

    def __init__(self, data: bytes, where: str):
        import torch

        self.data, self.where, self.torch = data, where, torch
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}
        self.fresh: dict[int, Any] = {}
        """id -> records made by NEWOBJ and not yet built: the only objects BUILD may fill."""
        self.classes = {key: getattr(importlib.import_module(key[0]), key[1]) for key in RECORDS}
        self.schemas = self._schemas()
        self.layouts = {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}

    # -- refusals
    def _unsafe(self, what: str) -> UnsafeCheckpoint:
        return UnsafeCheckpoint(f"{self.where} {what}, which checkpoint metadata never holds: refused, nothing in it "
                                f"was run or changed. {safepath.FIX}")

    def _malformed(self, why: str) -> CheckpointError:
        return CheckpointError(f"{self.where} is not checkpoint metadata: {why}")

    # -- what each record may hold
    def _schemas(self) -> dict[type, dict[str, tuple[Any, ...]]]:
        torch = self.torch
        c = {name: cls for (_, name), cls in self.classes.items()}
        size = (torch.Size,)
        return {
            c["Metadata"]: {"state_dict_metadata": (dict,), "planner_data": (dict, _NONE),
                            "storage_data": (dict, _NONE), "storage_meta": (c["StorageMeta"], _NONE),
                            "version": (str, _NONE)},
            c["TensorStorageMetadata"]: {"properties": (c["TensorProperties"],), "size": size, "chunks": (list,)},
            c["ChunkStorageMetadata"]: {"offsets": size, "sizes": size},
            c["BytesStorageMetadata"]: {},
            c["TensorProperties"]: {"dtype": (torch.dtype,), "layout": (torch.layout,), "requires_grad": (bool,),
                                    "memory_format": (torch.memory_format,), "pin_memory": (bool,)},
            c["MetadataIndex"]: {"fqn": (str,), "offset": (torch.Size, _NONE), "index": (int, _NONE)},
            c["StorageMeta"]: {"checkpoint_id": (str, PurePosixPath, _NONE), "save_id": (str, _NONE),
                               "load_id": (str, _NONE), "modules": (list,)},
            c["_StorageInfo"]: {"relative_path": (str,), "offset": (int,), "length": (int,),
                                "transform_descriptors": (list, tuple, _NONE)},
        }

    # -- the callables, answered here
    def _call(self, fn: _Global, args: tuple) -> Any:
        key = (fn.module, fn.name)
        torch = self.torch
        if key == ("torch", "Size"):
            if len(args) == 1 and isinstance(args[0], tuple) and all(type(v) is int for v in args[0]):
                return torch.Size(args[0])
        elif key == ("torch.serialization", "_get_layout"):
            if len(args) == 1 and isinstance(args[0], str) and args[0] in self.layouts:
                return self.layouts[args[0]]
        elif key == (_META, "_MEM_FORMAT_ENCODING"):
            enum = self.classes_enum()
            if len(args) == 1 and type(args[0]) is int and args[0] in {m.value for m in enum}:
                return enum(args[0])
        elif key in (("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")):
            if all(isinstance(a, str) for a in args):
                return PurePosixPath(*args)
        elif key == ("collections", "OrderedDict"):
            if not args:
                return OrderedDict()
            if len(args) == 1 and isinstance(args[0], list) and all(isinstance(p, tuple) and len(p) == 2
                                                                     for p in args[0]):
                return OrderedDict(args[0])
        else:
            raise self._unsafe(f"calls {fn!r}")
        raise self._unsafe(f"calls {fn!r} with arguments {_shown(args)}")

    def classes_enum(self):
        return importlib.import_module(_META)._MEM_FORMAT_ENCODING

    def _global(self, module: str, name: str) -> Any:
        if (module, name) in RECORDS or (module, name) in CALLABLES:
            return _Global(module, name)
        if module == "torch" and isinstance(getattr(self.torch, name, None), self.torch.dtype):
            return getattr(self.torch, name)
        raise self._unsafe(f"refers to {module}.{name}")

    def _newobj(self, cls: Any, args: Any) -> Any:
        if not isinstance(cls, _Global) or (cls.module, cls.name) not in RECORDS:
            raise self._unsafe(f"makes an instance of {_shown(cls)}")
        if args != ():
            raise self._unsafe(f"makes {cls!r} with arguments {_shown(args)}")
        record = self.classes[(cls.module, cls.name)]
        instance = object.__new__(record)
        self.fresh[id(instance)] = instance
        return instance

    def _build(self, instance: Any, state: Any) -> None:
        if id(instance) not in self.fresh or self.fresh[id(instance)] is not instance:
            raise self._unsafe(f"sets attributes on {_shown(instance)} (only a record it just made may be filled)")
        del self.fresh[id(instance)]
        cls = type(instance)
        schema = self.schemas[cls]
        if cls is self.classes[(_META, "TensorProperties")] and isinstance(state, tuple):
            state = self._tensor_properties(state)
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise self._unsafe(f"fills a {cls.__name__} with {_shown(state)} (not a mapping of field names)")
        for name, value in state.items():
            if name not in schema:
                raise self._unsafe(f"sets {cls.__name__}.{name}")
            if not isinstance(value, schema[name]) or type(value) is bool and bool not in schema[name]:
                raise self._unsafe(f"sets {cls.__name__}.{name} to a {type(value).__name__}")
        for field in dataclasses.fields(cls):
            if field.name in state:
                value = state[field.name]
            elif field.default is not dataclasses.MISSING:
                value = field.default
            elif field.default_factory is not dataclasses.MISSING:
                value = field.default_factory()
            else:
                raise self._malformed(f"a {cls.__name__} has no {field.name}")
            object.__setattr__(instance, field.name, value)  # frozen records (MetadataIndex) too

    def _tensor_properties(self, state: tuple) -> dict[str, Any]:
        """TensorProperties pickles as (dtype, layout, requires_grad, memory-format code, pin_memory)."""
        torch = self.torch
        enum = self.classes_enum()
        if len(state) != 5 or not isinstance(state[3], enum):
            raise self._unsafe(f"fills a TensorProperties with {_shown(state)}")
        formats = {enum.TORCH_CONTIGUOUS_FORMAT: torch.contiguous_format, enum.TORCH_CHANNELS_LAST: torch.channels_last,
                   enum.TORCH_PRESERVE_FORMAT: torch.preserve_format}
        return {"dtype": state[0], "layout": state[1], "requires_grad": state[2], "memory_format": formats[state[3]],
                "pin_memory": state[4]}

    # -- the opcodes
    def _pop_mark(self) -> list[Any]:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i] is _MARK:
                items = self.stack[i + 1:]
                del self.stack[i:]
                return items
        raise self._malformed("a MARK is missing")

    def _pop(self) -> Any:
        if not self.stack or self.stack[-1] is _MARK:
            raise self._malformed("the stack ran empty")
        return self.stack.pop()

    def _top(self, kind: type) -> Any:
        if not self.stack or type(self.stack[-1]) is not kind:
            raise self._unsafe(f"adds items to {_shown(self.stack[-1] if self.stack else None)}")
        return self.stack[-1]

    def load(self) -> Any:
        handlers = self._handlers()
        try:
            for opcode, arg, _ in pickletools.genops(self.data):
                if opcode.name == "STOP":
                    result = self._pop()
                    for record in list(self.fresh.values()):  # pickled without state (BytesStorageMetadata)
                        self._build(record, {})
                    return result
                handler = handlers.get(opcode.name)
                if handler is None:
                    raise self._unsafe(f"uses the pickle opcode {opcode.name}")
                handler(arg)
        except (UnsafeCheckpoint, CheckpointError):
            raise
        except (ValueError, KeyError, TypeError, IndexError) as exc:  # genops' own decoding errors, bad memo keys
            raise self._malformed(str(exc) or type(exc).__name__) from None
        raise self._malformed("it ends without STOP")

    def _handlers(self) -> dict[str, Callable[[Any], None]]:
        push = self.stack.append
        value = lambda v: lambda _arg: push(v)  # noqa: E731 - a table of one-liners
        literal = lambda arg: push(arg)  # noqa: E731

        def memoize(_arg):
            self.memo[len(self.memo)] = self.stack[-1]

        def put(arg):
            self.memo[int(arg)] = self.stack[-1]

        def get(arg):
            push(self.memo[int(arg)])

        def setitems(_arg):
            items = self._pop_mark()
            target = self._top(dict) if type(self.stack[-1]) is dict else self._top(OrderedDict)
            if len(items) % 2:
                raise self._malformed("SETITEMS with an odd number of items")
            for k, v in zip(items[::2], items[1::2], strict=True):
                target[k] = v

        def setitem(_arg):
            v, k = self._pop(), self._pop()
            target = self._top(dict) if type(self.stack[-1]) is dict else self._top(OrderedDict)
            target[k] = v

        def appends(_arg):
            items = self._pop_mark()
            self._top(list).extend(items)

        def append(_arg):
            item = self._pop()
            self._top(list).append(item)

        def additems(_arg):
            items = self._pop_mark()
            self._top(set).update(items)

        def tuple_n(n):
            def make(_arg):
                items = [self._pop() for _ in range(n)][::-1]
                push(tuple(items))
            return make

        def stack_global(_arg):
            name, module = self._pop(), self._pop()
            if not isinstance(name, str) or not isinstance(module, str):
                raise self._malformed("STACK_GLOBAL without names")
            push(self._global(module, name))

        def global_(arg):
            module, name = str(arg).split(" ", 1)
            push(self._global(module, name))

        def reduce(_arg):
            args, fn = self._pop(), self._pop()
            if not isinstance(fn, _Global) or not isinstance(args, tuple):
                raise self._unsafe(f"calls {_shown(fn)}")
            push(self._call(fn, args))

        def newobj(_arg):
            args, cls = self._pop(), self._pop()
            push(self._newobj(cls, args))

        def build(_arg):
            state = self._pop()
            self._build(self.stack[-1] if self.stack else None, state)

        def pop_mark(_arg):
            self._pop_mark()

        return {
            "PROTO": lambda _a: None, "FRAME": lambda _a: None, "MARK": lambda _a: push(_MARK),
            "POP": lambda _a: self._pop(), "POP_MARK": pop_mark, "DUP": lambda _a: push(self.stack[-1]),
            "NONE": value(None), "NEWTRUE": value(True), "NEWFALSE": value(False),
            "INT": literal, "BININT": literal, "BININT1": literal, "BININT2": literal, "LONG": literal,
            "LONG1": literal, "LONG4": literal, "BINFLOAT": literal, "FLOAT": literal,
            "UNICODE": literal, "BINUNICODE": literal, "SHORT_BINUNICODE": literal, "BINUNICODE8": literal,
            "BINBYTES": literal, "SHORT_BINBYTES": literal, "BINBYTES8": literal,
            "EMPTY_LIST": lambda _a: push([]), "APPEND": append, "APPENDS": appends,
            "LIST": lambda _a: push(self._pop_mark()),
            "EMPTY_TUPLE": value(()), "TUPLE": lambda _a: push(tuple(self._pop_mark())),
            "TUPLE1": tuple_n(1), "TUPLE2": tuple_n(2), "TUPLE3": tuple_n(3),
            "EMPTY_DICT": lambda _a: push({}), "SETITEM": setitem, "SETITEMS": setitems,
            "DICT": lambda _a: push(_pairs(self._pop_mark())),
            "EMPTY_SET": lambda _a: push(set()), "ADDITEMS": additems,
            "FROZENSET": lambda _a: push(frozenset(self._pop_mark())),
            "MEMOIZE": memoize, "PUT": put, "BINPUT": put, "LONG_BINPUT": put,
            "GET": get, "BINGET": get, "LONG_BINGET": get,
            "GLOBAL": global_, "STACK_GLOBAL": stack_global, "REDUCE": reduce, "NEWOBJ": newobj, "BUILD": build,
        }


def _pairs(items: list[Any]) -> dict[Any, Any]:
    if len(items) % 2:
        raise CheckpointError("DICT with an odd number of items")
    return dict(zip(items[::2], items[1::2], strict=True))


def _shown(value: Any) -> str:
    """A short description of an object for a refusal (never its repr if it is a mapping or a long value)."""
    if isinstance(value, _Global):
        return repr(value)
    if isinstance(value, type):
        return f"the class {value.__module__}.{value.__qualname__}"
    if isinstance(value, Mapping):
        return f"a mapping of {len(value)} item(s)"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def loads(data: bytes, where: str) -> Any:
    """The object a DCP `.metadata` pickle describes, built by MetadataUnpickler."""
    return MetadataUnpickler(data, where).load()
