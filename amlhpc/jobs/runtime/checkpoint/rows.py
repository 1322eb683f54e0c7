"""A reshard restore reads the rows of a stored tensor its load needs, not the whole tensor.

DCP's file reader loads each stored item whole (`torch.load` of the chunk one rank saved) and
then narrows it to what the load plan asks. When the version's data files stay in Blob
(ranged.py), that reads every saved chunk a new shard overlaps: 1.5x the state from 4 ranks to
3, 1.11x for Llama 3 405B from 100 nodes to 90 (bench/shrink_reads.py). Here a load plan's
tensor reads are served first, by the rows they need: FSDP2 shards on dim 0, so a new shard
needs a run of rows of each saved chunk it overlaps, and in a stored chunk those are one run of
bytes (1.007x and 1.003x instead: tests/test_ranged_restore.py, bench/shrink_reads.py).

Where those bytes are comes from the item's first block: a stored item is `torch.save`'s zip
archive, streamed, so its pickle (`data.pkl`: the tensor's storage, offset, shape and strides)
and three small records come first, each with its local header and a data descriptor holding
its size and CRC-32, then the `data/0` record's header and the elements. Only a plain row-major
tensor whose storage is exactly its elements, of the shape and dtype DCP's metadata records for
that chunk, is read by rows; anything else (a view, a transform, a 0-d value, a pickle naming
another class, a record that does not match its CRC-32) goes to DCP's own reader, whole, as
before. A read of every row of a chunk goes there too (whole items keep runs of blocks
unbroken). The bytes come through the same RemoteFile reader, so every block is checked
against its digest and shared with the node's other ranks.

Standard library, plus torch (the job's own).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import logging
import math
import pickle
import pickletools
import struct
import sys
import warnings
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from amlhpc.jobs.runtime.checkpoint.ranged import RemoteFiles

log = logging.getLogger("amlhpc.checkpoint")

LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
"""A zip local file header's fixed 30 bytes (APPNOTE.TXT 4.3.7); then the name and the extra field."""
LOCAL_SIGNATURE = 0x04034B50
HEAD_BYTES = 4096
"""What is read of an item's start to find its elements: `torch.save` puts the pickle and three
small records (~700 bytes) before them; a block is fetched whole anyway."""
DESCRIPTOR = struct.Struct("<IIII")
"""A data descriptor (signature, CRC-32, sizes), after a record written without its sizes (flag bit 3)."""
DESCRIPTOR64 = struct.Struct("<IIQQ")
DESCRIPTOR_SIGNATURE = 0x08074B50
DESCRIPTOR_MARK = struct.pack("<I", DESCRIPTOR_SIGNATURE)


@dataclass(frozen=True)
class Layout:
    """Where a stored tensor's elements are inside its item, and what they are."""

    data_offset: int
    """From the item's first byte to its first element."""
    shape: tuple[int, ...]
    dtype: Any

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape[1:]) * self.dtype.itemsize


class _Rebuilt(dict):
    """What `torch._utils._rebuild_tensor_v2` was called with, in place of the tensor."""


def _rebuild_tensor_v2(storage, storage_offset, size, stride, *_ignored) -> _Rebuilt:
    return _Rebuilt(storage=storage, storage_offset=storage_offset, size=tuple(size), stride=tuple(stride))


class _Probe(pickle.Unpickler):
    """Reads `data.pkl` without building anything: the storage's persistent id and the tensor's
    geometry; any class but the few a plain tensor's pickle names is refused. Each allowed name
    is answered with a function made for this read: pickle's BUILD sets attributes on whatever
    is on its stack (metapickle.py says why that matters), so a forged pickle reaches only
    objects that die with the read, never this module's function or the OrderedDict class."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda *args: _rebuild_tensor_v2(*args)
        if (module, name) == ("collections", "OrderedDict"):
            return lambda *args: collections.OrderedDict(*args)
        if module == "torch" and name.endswith("Storage"):
            return name
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        return tuple(pid)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def layout(head: bytes, length: int, expected_shape: tuple[int, ...], expected_dtype: Any) -> Layout | None:
    """The layout of a stored item from its first bytes `head` (of `length` in all), or None when
    it is not a plain row-major tensor of that shape and dtype with nothing else in its storage
    (then DCP reads it whole).

    `torch.save` streams its archive: each record's local header comes before its bytes, and a
    data descriptor after them carries the sizes (APPNOTE.TXT 4.3.9). The records before the
    elements are walked from the item's start: the pickle ends at its STOP, each small record at
    its descriptor, and every one of them is held to its descriptor's size and CRC-32."""
    position, pickled, little = 0, None, True
    while position + LOCAL_HEADER.size <= len(head):
        signature, _, flags, method, _, _, crc, size, _, name_length, extra_length = LOCAL_HEADER.unpack_from(
            head, position)
        name = head[position + LOCAL_HEADER.size:position + LOCAL_HEADER.size + name_length]
        start = position + LOCAL_HEADER.size + name_length + extra_length
        if signature != LOCAL_SIGNATURE or method != zipfile.ZIP_STORED or start > len(head):
            return None
        if name.endswith(b"/data/0"):
            return _plain(pickled, little, start, length, expected_shape, expected_dtype)
        described = bool(flags & 0x8)  # the sizes come after the bytes
        if name.endswith(b"/data.pkl"):
            if pickled is not None:
                return None
            pickled, size = _unpickle(head[start:])
            if pickled is None:
                return None
        elif described:
            size = head.find(DESCRIPTOR_MARK, start) - start
            if size < 0:
                return None
        if described:
            described_crc = _descriptor(head, start + size, size)
            if described_crc is None:
                return None
            crc = described_crc
        body = head[start:start + size]
        if len(body) != size or zlib.crc32(body) != crc:
            return None
        if name.endswith(b"/byteorder"):
            little = body == b"little"
        position = start + size + (_descriptor_size(head, start + size) if described else 0)
    return None


def _descriptor_size(head: bytes, at: int) -> int:
    return DESCRIPTOR.size if _descriptor(head, at, None, DESCRIPTOR) is not None else DESCRIPTOR64.size


def _descriptor(head: bytes, at: int, size: int | None, form: struct.Struct | None = None) -> int | None:
    """The CRC-32 of the data descriptor at `at` when it is one and records `size` (any size when
    None), in the 4-byte or the Zip64 8-byte form (APPNOTE.TXT 4.3.9.1), else None."""
    for shape in [form] if form else [DESCRIPTOR, DESCRIPTOR64]:
        if at + shape.size <= len(head):
            mark, crc, stored, _ = shape.unpack_from(head, at)
            if mark == DESCRIPTOR_SIGNATURE and (size is None or stored == size):
                return crc
    return None


def _unpickle(data: bytes) -> tuple[_Rebuilt | None, int]:
    """The tensor `data.pkl` at the start of `data` describes, and the pickle's length."""
    try:
        end = next((position or 0) + 1 for opcode, _, position in pickletools.genops(data) if opcode.name == "STOP")
        rebuilt = _Probe(io.BytesIO(data[:end])).load()
    except (pickle.UnpicklingError, ValueError, EOFError, TypeError, StopIteration) as exc:
        log.debug("checkpoint item not read by rows: %s", exc)
        return None, 0
    return (rebuilt if isinstance(rebuilt, _Rebuilt) else None), end


def _plain(pickled: _Rebuilt | None, little: bool, start: int, length: int, expected_shape: tuple[int, ...],
           expected_dtype: Any) -> Layout | None:
    """The layout when the pickle describes a plain tensor of that shape and dtype, else None."""
    import torch

    if pickled is None or not little or sys.byteorder != "little":
        return None
    storage, geometry = pickled["storage"], (*pickled["size"], *pickled["stride"], pickled["storage_offset"])
    if not all(type(n) is int for n in geometry) or not isinstance(storage, tuple) or len(storage) != 5:
        return None  # a pickle that is not a tensor's, however it parsed
    if storage[0] != "storage" or storage[2] != "0" or not isinstance(storage[1], str):
        return None
    shape, numel = pickled["size"], math.prod(pickled["size"])
    with warnings.catch_warnings():  # the typed storage classes' deprecation: their dtype is all we ask
        warnings.simplefilter("ignore", UserWarning)
        stored_dtype = getattr(getattr(torch, storage[1], None), "dtype", None)
    plain = (stored_dtype == expected_dtype
             and shape == tuple(expected_shape) and len(shape) >= 1 and pickled["storage_offset"] == 0
             and pickled["stride"] == _contiguous(shape) and storage[4] == numel
             and start + numel * expected_dtype.itemsize <= length)
    return Layout(start, shape, expected_dtype) if plain else None


def _chunks_by_offset(metadata, fqn: str) -> dict[tuple[int, ...], tuple[tuple[int, ...], Any] | None]:
    """The stored chunks of tensor `fqn` by their offsets: (sizes, dtype), or None where two share
    an offset (not read by rows); empty when `fqn` is no chunked tensor."""
    described = metadata.state_dict_metadata.get(fqn)
    found: dict[tuple[int, ...], tuple[tuple[int, ...], Any] | None] = {}
    for chunk in getattr(described, "chunks", None) or []:
        offsets = tuple(chunk.offsets)
        found[offsets] = None if offsets in found else (tuple(chunk.sizes), described.properties.dtype)
    return found


class RowReads:
    """Serves the tensor reads of a load plan by rows from the version's remote files; the rest
    goes to DCP's reader (`plain`)."""

    def __init__(self, metadata, remote: RemoteFiles, plain: Callable[[Any, Any], Any]):
        self.metadata, self.remote, self.plain = metadata, remote, plain
        self.layouts: dict[tuple[str, int], Layout | None] = {}
        self.chunks: dict[str, dict[tuple[int, ...], tuple[tuple[int, ...], Any] | None]] = {}
        """Per tensor, its chunks by offset: built once, as a 405B tensor has 8,000 chunks at 1,000 nodes."""
        self.by_rows = 0
        """Read items this process served by rows."""

    def read_data(self, plan, planner):
        from torch.distributed.checkpoint.planner import LoadItemType

        rest, streams = [], {}
        try:
            for item in plan.items:
                info = self.metadata.storage_data[item.storage_index]
                path = info.relative_path
                if item.type != LoadItemType.TENSOR or getattr(info, "transform_descriptors", None) or path not in self.remote:
                    rest.append(item)
                    continue
                if path not in streams:
                    streams[path] = self.remote.open(path)
                if not self._read_rows(item, info, streams[path], planner):
                    rest.append(item)
        finally:
            for stream in streams.values():
                stream.close()
        return self.plain(dataclasses.replace(plan, items=rest), planner)

    def _read_rows(self, item, info, stream: io.BufferedIOBase, planner) -> bool:
        import torch

        index = item.storage_index
        if index.fqn not in self.chunks:
            self.chunks[index.fqn] = _chunks_by_offset(self.metadata, index.fqn)
        chunk = self.chunks[index.fqn].get(tuple(index.offset))
        if chunk is None:
            return False
        if item.lengths[0] == chunk[0][0]:
            return False  # every row: DCP reads the item whole, in the same run of blocks as its neighbours
        key = (info.relative_path, info.offset)
        if key not in self.layouts:
            stream.seek(info.offset)
            self.layouts[key] = layout(stream.read(min(HEAD_BYTES, info.length)), info.length, *chunk)
        found = self.layouts[key]
        if found is None:
            return False
        first, rows = item.storage_offsets[0], item.lengths[0]
        stream.seek(info.offset + found.data_offset + first * found.row_bytes)
        data = bytearray(stream.read(rows * found.row_bytes))
        if len(data) != rows * found.row_bytes:
            return False
        tensor = torch.frombuffer(data, dtype=found.dtype) if data else torch.empty(0, dtype=found.dtype)
        tensor = tensor.reshape(rows, *found.shape[1:])
        for dim in range(1, tensor.dim()):
            tensor = tensor.narrow(dim, item.storage_offsets[dim], item.lengths[dim])
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise AssertionError(f"read item {item.storage_index} is {tuple(tensor.size())}, its target "
                                 f"{tuple(target.size())}")  # as DCP's own reader says it
        target.copy_(tensor)
        planner.commit_tensor(item, target)
        self.by_rows += 1
        return True


def read_by_rows(reader, metadata, remote: RemoteFiles) -> RowReads:
    """Make DCP reader `reader` serve its tensor reads by rows from `remote` first."""
    rows = RowReads(metadata, remote, reader.read_data)
    reader.read_data = rows.read_data
    return rows
