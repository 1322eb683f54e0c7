"""amlhpc.jobs.runtime.staging.manifest: the resume record, read back all at once or line by line alike."""

from __future__ import annotations

import random

import pytest

from amlhpc.jobs.runtime.blob.fetch import BlobEntry
from amlhpc.jobs.runtime.staging import manifest
from amlhpc.jobs.runtime.staging.manifest import HEADER, Manifest


def line_by_line(text: str) -> dict:
    records: dict = {}
    manifest._load_tsv_lines(text.split("\n"), records)
    return records


def random_manifest(rng: random.Random, odd: bool) -> str:
    lines = [HEADER.rstrip("\n")]
    for i in range(rng.randint(0, 40)):
        path = f"d{i % 3}/f{rng.randint(0, 30)}.bin"  # repeated paths: the last record wins
        if odd and rng.random() < 0.2:
            path = rng.choice(["tab\\there", "new\\nline", "back\\\\slash", "#hash"])
        size = str(rng.randint(0, 10**9))
        if odd and rng.random() < 0.1:
            size = rng.choice(["", "x1", "1.5"])
        line = "\t".join([path, f"ds/{path}.gz", f"0x{i:X}", size, f"md5-{i}"])
        if odd and rng.random() < 0.1:
            line = line[:rng.randint(0, len(line))]  # cut short by a kill
        lines.append(line)
    return "\n".join(lines) + rng.choice(["\n", ""])


@pytest.mark.parametrize("odd", [False, True])
def test_all_at_once_reads_what_line_by_line_reads(odd, monkeypatch):
    rng = random.Random(7 if odd else 8)
    texts = [random_manifest(rng, odd) for _ in range(300)]
    expected = [line_by_line(text) for text in texts]
    slow = []
    by_lines = manifest._load_tsv_lines

    def counted(lines, records):
        slow.append(lines)
        by_lines(lines, records)

    monkeypatch.setattr(manifest, "_load_tsv_lines", counted)
    for text, want in zip(texts, expected, strict=True):
        records: dict = {}
        manifest._load_tsv(text, records)
        assert records == want, text
    assert (len(slow) > 50) if odd else not slow  # plain files never take the slow way


def test_escaped_names_and_cut_lines_round_trip(tmp_path):
    kept = Manifest(tmp_path, 0, flush_every=1)
    tab = BlobEntry("ds/a\tb.gz", 10, etag="0x1")
    plain = BlobEntry("ds/c.gz", 20, etag="0x2")
    kept.record(tab, "a\tb", 30)
    kept.record(plain, "c", 40)
    kept.close()
    with open(tmp_path / "manifest-node0.tsv", "a", encoding="utf-8") as f:
        f.write("d\tds/d.gz\t0x3\t5")  # killed mid-line
    again = Manifest(tmp_path, 0)
    assert again.finished(tab, "a\tb", 30) and again.finished(plain, "c", 40)
    assert "d" not in again.records and len(again.records) == 2
