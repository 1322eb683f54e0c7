"""amlhpc.jobs.runtime.blob.gzmembers: a file as independent gzip members, an index that fits in metadata."""

from __future__ import annotations

import gzip
import zlib

import pytest

from amlhpc.jobs.data.upload import compressor
from amlhpc.jobs.runtime.blob import gzmembers
from bench.dataset import volume_bytes


def members_of(data: bytes, member_bytes: int) -> tuple[bytes, list[int]]:
    writer = gzmembers.MemberWriter(1, member_bytes, compressobj=lambda: compressor(1))
    stored = writer.feed(data[:1000]) + writer.feed(data[1000:]) + writer.finish()
    return stored, writer.sizes


class TestWriter:
    def test_any_gzip_reader_sees_one_file(self):
        data = volume_bytes(1, 300_000)
        stored, sizes = members_of(data, 64 << 10)
        assert gzip.decompress(stored) == data  # the standard library reads concatenated members
        assert zlib.decompress(stored[:sizes[0]], 16 + zlib.MAX_WBITS) == data[:64 << 10]
        assert len(sizes) == 5 and sum(sizes) == len(stored)

    def test_each_member_inflates_alone_to_its_share(self):
        data = volume_bytes(2, 200_001)
        stored, sizes = members_of(data, 50_000)
        offset = 0
        for index, size in enumerate(sizes):
            expected = data[index * 50_000:(index + 1) * 50_000]
            assert gzmembers.inflate_member(stored[offset:offset + size], len(expected), "b", index) == expected
            offset += size

    def test_an_exact_multiple_and_an_empty_file(self):
        assert len(members_of(b"x" * 100, 50)[1]) == 2
        stored, sizes = members_of(b"", 50)
        assert gzip.decompress(stored) == b"" and len(sizes) == 1


class TestIndex:
    def test_round_trip_and_bad_text(self):
        assert gzmembers.decode_index(gzmembers.encode_index([20, 300, 4_000_000])) == [20, 300, 4_000_000]
        for bad in ("not base64!", "AAA=", gzmembers.encode_index([5])):
            with pytest.raises(gzmembers.MemberError):
                gzmembers.decode_index(bad)

    def test_the_index_always_fits_in_blob_metadata(self):
        """8 KiB for all of a blob's metadata: a 5 TB file still gets at most MAX_MEMBERS members."""
        for size in (1, 8 << 20, 10 << 30, 5 << 40):
            member = gzmembers.member_size_for(size)
            count = -(-size // member)
            assert count <= gzmembers.MAX_MEMBERS and member >= gzmembers.DEFAULT_MEMBER_BYTES
            assert len(gzmembers.encode_index([2**32 - 1] * count)) < 6 << 10


class TestInflateChecks:
    def test_corruption_truncation_and_a_wrong_index_are_named(self):
        data = volume_bytes(3, 100_000)
        member = gzip.compress(data)
        flipped = bytearray(member)
        flipped[len(member) // 2] ^= 0x40
        cases = [(bytes(flipped), len(data), "corrupt|more than|holds"), (member[:-4], len(data), "ends early"),
                 (member + b"junk", len(data), "stray bytes"), (member, len(data) - 1, "holds 100000 bytes, the index says 99999"),
                 (member, len(data) + 1, "holds 100000 bytes")]
        for raw, expected, message in cases:
            with pytest.raises(gzmembers.MemberError, match=message):
                gzmembers.inflate_member(raw, expected, "blob", 3)
