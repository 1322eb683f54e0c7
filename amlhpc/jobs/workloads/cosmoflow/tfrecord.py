"""TFRecord framing and the tf.train.Example subset CosmoFlow uses, without TensorFlow.

A TFRecord file is a sequence of records, each:
    uint64 length (little endian) | uint32 masked CRC32C of the length bytes |
    data (length bytes)           | uint32 masked CRC32C of the data
with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32).

CosmoFlow's records are tf.train.Example protobufs with two features:
    x: bytes_list with one value, the raw little-endian int16 volume [D, D, D, 4]
    y: float_list with the 4 target parameters
The protobuf subset here (Example > Features > map<string, Feature> > BytesList /
FloatList / Int64List) covers that and reads packed or unpacked repeated fields.

CRC32C (Castagnoli) uses google-crc32c's C implementation when installed, else a table in
Python (correct, ~MB/s: fine for tests and small files; data CRCs are verified only when
asked, lengths always).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TypeGuard

try:  # hardware-accelerated when available
    import google_crc32c as _gcrc

    def crc32c(data: bytes) -> int:
        return _gcrc.value(bytes(data))
except ImportError:  # pragma: no cover - exercised where google-crc32c is absent
    def _table() -> list[int]:
        table = []
        for i in range(256):
            crc = i
            for _ in range(8):
                crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
            table.append(crc)
        return table

    _TABLE = _table()

    def crc32c(data: bytes) -> int:
        crc = 0xFFFFFFFF
        table = _TABLE
        for byte in bytes(data):
            crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF


class TFRecordError(ValueError):
    """A corrupt or truncated TFRecord file (names the file and the byte offset)."""


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def write_record(stream: BinaryIO, data: bytes) -> None:
    header = struct.pack("<Q", len(data))
    stream.write(header)
    stream.write(struct.pack("<I", masked_crc(header)))
    stream.write(data)
    stream.write(struct.pack("<I", masked_crc(data)))


def read_records(path: str | Path, verify_data: bool = False) -> Iterator[bytes]:
    """Yield each record's bytes; length CRCs always checked, data CRCs when asked."""
    with open(path, "rb") as stream:
        offset = 0
        while True:
            header = stream.read(12)
            if not header:
                return
            if len(header) < 12:
                raise TFRecordError(f"{path}: truncated record header at byte {offset}")
            (length,) = struct.unpack("<Q", header[:8])
            (length_crc,) = struct.unpack("<I", header[8:])
            if masked_crc(header[:8]) != length_crc:
                raise TFRecordError(f"{path}: bad length checksum at byte {offset} (not a TFRecord file, or corrupt)")
            data = stream.read(length)
            footer = stream.read(4)
            if len(data) < length or len(footer) < 4:
                raise TFRecordError(f"{path}: truncated record at byte {offset} ({len(data)} of {length} bytes)")
            if verify_data and masked_crc(data) != struct.unpack("<I", footer)[0]:
                raise TFRecordError(f"{path}: bad data checksum in the record at byte {offset}")
            offset += 16 + length
            yield data


# --- protobuf wire format: just what tf.train.Example needs -----------------------------

def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise TFRecordError("truncated varint in Example")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _field(number: int, wire: int, payload: bytes) -> bytes:
    key = _varint((number << 3) | wire)
    if wire == 2:
        return key + _varint(len(payload)) + payload
    return key + payload


def _fields(buf: memoryview) -> Iterator[tuple[int, int, memoryview | int]]:
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 2:
            length, pos = _read_varint(buf, pos)
            yield number, wire, buf[pos:pos + length]
            pos += length
        elif wire == 0:
            value, pos = _read_varint(buf, pos)
            yield number, wire, value
        elif wire == 5:
            yield number, wire, buf[pos:pos + 4]
            pos += 4
        elif wire == 1:
            yield number, wire, buf[pos:pos + 8]
            pos += 8
        else:
            raise TFRecordError(f"unsupported protobuf wire type {wire}")


Feature = bytes | list[float] | list[int]


def _all_ints(values: list[float] | list[int]) -> TypeGuard[list[int]]:
    return all(isinstance(v, int) for v in values)


def encode_example(features: dict[str, Feature]) -> bytes:
    """tf.train.Example bytes: bytes values -> BytesList, floats -> FloatList, ints -> Int64List."""
    entries = b""
    for name, value in features.items():
        if isinstance(value, (bytes, bytearray)):
            feature = _field(1, 2, _field(1, 2, bytes(value)))
        elif value and _all_ints(value):
            feature = _field(3, 2, _field(1, 2, b"".join(_varint(v & ((1 << 64) - 1)) for v in value)))
        else:
            feature = _field(2, 2, _field(1, 2, struct.pack(f"<{len(value)}f", *value)))
        entry = _field(1, 2, name.encode()) + _field(2, 2, feature)
        entries += _field(1, 2, entry)
    return _field(1, 2, entries)


def decode_example(data: bytes) -> dict[str, Feature]:
    """Parse a tf.train.Example into {name: bytes | [float] | [int]} (first bytes value)."""
    out: dict[str, Feature] = {}
    for number, wire, features in _fields(memoryview(data)):
        if number != 1 or wire != 2 or not isinstance(features, memoryview):
            continue
        for fnum, fwire, entry in _fields(features):  # map entries
            if fnum != 1 or fwire != 2 or not isinstance(entry, memoryview):
                continue
            name, feature = "", memoryview(b"")
            for enum_, _, value in _fields(entry):
                if enum_ == 1:
                    name = bytes(value).decode()
                elif enum_ == 2:
                    feature = _payload(value)
            out[name] = _decode_feature(feature)
    return out


def _payload(value: memoryview | int) -> memoryview:
    """A length-delimited field's bytes (a varint where a message belongs: not an Example)."""
    if isinstance(value, int):
        raise TFRecordError("a varint where a length-delimited field belongs in Example")
    return value


def _decode_feature(feature: memoryview) -> Feature:
    for kind, _, field in _fields(feature):
        payload = _payload(field) if kind in (1, 2, 3) else memoryview(b"")
        if kind == 1:  # BytesList
            values = [bytes(v) for n, _, v in _fields(payload) if n == 1]
            return values[0] if values else b""
        if kind == 2:  # FloatList, packed or not
            floats: list[float] = []
            for n, w, v in _fields(payload):
                if n == 1 and w == 2:
                    floats.extend(struct.unpack(f"<{len(_payload(v)) // 4}f", _payload(v)))
                elif n == 1 and w == 5:
                    floats.append(struct.unpack("<f", _payload(v))[0])
            return floats
        if kind == 3:  # Int64List, packed or not
            ints: list[int] = []
            for n, w, v in _fields(payload):
                if n == 1 and w == 2:
                    pos, raw = 0, _payload(v)
                    while pos < len(raw):
                        value, pos = _read_varint(raw, pos)
                        ints.append(value - (1 << 64) if value >= 1 << 63 else value)
                elif n == 1 and w == 0 and isinstance(v, int):  # wire 0 is always a varint
                    ints.append(v - (1 << 64) if v >= 1 << 63 else v)
            return ints
    return b""
