"""Listing, assignment and resume for a million blobs, without a server: how long and how much memory.

    python -m bench.listing [--blobs 1000000] [--nodes 8] [--ranks 8] [--json]

List Blobs pages are generated in the service's format (the element layout of the page
recorded from Azurite in tests/fixtures/listing/page1.xml: every property the service
returns; no metadata, as staging lists without it), 5,000 blobs a page as the service
pages them, in CosmoFlow-like names spread over folders of 1,000. A manifest with a
record for every blob of node 0 is written as an earlier, finished run would have left it.
Then, timed step by step (page generation and file writing excluded):

1. parse every page into entries, one page held at a time, as staging lists
   (amlhpc.jobs.runtime.blob.listing.list_all, following the markers; generating a page is not counted);
2. plan: paths, collision checks and the byte-balanced split over nodes and node 0's
   ranks (staging.make_plan, `local` mode);
3. load the manifest and decide, for each of node 0's files, whether it is finished,
   given the sizes a walk of the data directory would report (all present);
4. write node 0's rank file lists.

Each step reports wall and CPU seconds (the CPU figure is what another process on a busy
machine cannot inflate). Peak memory is the process's maximum resident set size
(getrusage ru_maxrss), so run it in a process of its own (tests/test_listing.py does).
Target: all four steps under 10 s and the process under 1 GB.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

PAGE = 5000
_HEAD = (b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><EnumerationResults '
         b'ServiceEndpoint="http://127.0.0.1:10000/amlhpcdev" ContainerName="datasets"><Prefix>ds/</Prefix>'
         b'<Marker>%s</Marker><MaxResults>5000</MaxResults><Blobs>')
_BLOB = (b"<Blob><Name>ds/u%05d/univ_ics_2019-03_a%05d_%03d.tfrecord.gz</Name><Properties>"
         b"<Creation-Time>Mon, 23 Nov 2026 15:54:03 GMT</Creation-Time><Last-Modified>Mon, 23 Nov 2026 15:54:03 GMT"
         b"</Last-Modified><Etag>0x1FFE5FF%09X</Etag><Content-Length>%d</Content-Length>"
         b"<Content-Type>application/octet-stream</Content-Type><Content-Encoding>gzip</Content-Encoding>"
         b"<Content-MD5>%022dA==</Content-MD5><BlobType>BlockBlob</BlobType><LeaseStatus>unlocked</LeaseStatus>"
         b"<LeaseState>available</LeaseState><ServerEncrypted>true</ServerEncrypted><AccessTier>Hot</AccessTier>"
         b"<AccessTierInferred>true</AccessTierInferred><AccessTierChangeTime>Mon, 23 Nov 2026 15:54:03 GMT"
         b"</AccessTierChangeTime></Properties></Blob>")


def blob_fields(i: int) -> tuple[int, int, int, int, int, int]:
    """The values of blob i: folder, universe, file, etag, stored size, md5."""
    return i // 1000, i // 64, i % 64, i, 1000 + (i * 7919) % 8192, i


def page_at(blobs: int, start: int) -> bytes:
    """The page of a listing of `blobs` blobs (name order) that starts at blob `start`."""
    end = min(blobs, start + PAGE)
    marker = b"" if start == 0 else b"m%d" % start
    tail = b"<NextMarker>m%d</NextMarker>" % end if end < blobs else b"<NextMarker/>"
    return b"".join([_HEAD % marker, *(_BLOB % blob_fields(i) for i in range(start, end)),
                     b"</Blobs>", tail, b"</EnumerationResults>"])


def pages(blobs: int) -> Iterator[bytes]:
    """The listing of `blobs` blobs as the service pages it (name order)."""
    for start in range(0, blobs, PAGE):
        yield page_at(blobs, start)


def write_manifest(path: Path, entries, rels, indices) -> None:
    """The manifest a finished run of node 0 would have left (one record per file)."""
    from amlhpc.jobs.runtime.staging.manifest import HEADER

    with open(path, "w", encoding="utf-8") as out:
        out.write(HEADER)
        for start in range(0, len(indices), 50_000):
            out.write("".join(f"{rels[k]}\t{entries[k].name}\t{entries[k].etag}\t{entries[k].size * 5}\t"
                              f"{entries[k].identity}\n" for k in indices[start:start + 50_000]))


def measure(blobs: int, nodes: int, ranks: int) -> dict:
    from amlhpc.jobs.runtime.base.ranks import validated
    from amlhpc.jobs.runtime.blob import listing
    from amlhpc.jobs.runtime.staging import stager as staging
    from amlhpc.jobs.runtime.staging.manifest import Manifest

    making = {"wall": 0.0, "cpu": 0.0}  # generating pages is not listing: taken out of the figures

    def fetch(marker: str | None) -> bytes:
        start, start_cpu = time.perf_counter(), time.process_time()
        page = page_at(blobs, int(marker[1:]) if marker else 0)
        making["wall"] += time.perf_counter() - start
        making["cpu"] += time.process_time() - start_cpu
        return page

    timings: dict[str, float] = {}
    cpu: dict[str, float] = {}
    start, start_cpu = time.perf_counter(), time.process_time()
    entries = listing.list_all(fetch, with_metadata=False)
    timings["parse"] = time.perf_counter() - start - making["wall"]
    cpu["parse"] = time.process_time() - start_cpu - making["cpu"]
    spec = staging.StageSpec("cosmo", "datasets", prefix="ds", mode="local")
    node = validated(0, 0, nodes * ranks, ranks)
    start, start_cpu = time.perf_counter(), time.process_time()
    plan = staging.make_plan(spec, None, entries, node)
    timings["plan"], cpu["plan"] = time.perf_counter() - start, time.process_time() - start_cpu
    with tempfile.TemporaryDirectory(prefix="amlhpc-listing-") as tmp:
        staging_dir = Path(tmp) / "staging"
        staging_dir.mkdir()
        write_manifest(staging_dir / "manifest-node0.tsv", entries, plan.rels, plan.node_idx)
        present = {plan.rels[k]: entries[k].size * 5 for k in plan.node_idx}  # what the walk would find
        start, start_cpu = time.perf_counter(), time.process_time()
        manifest = Manifest(staging_dir, 0)
        finished = sum(1 for k in plan.node_idx if manifest.finished(entries[k], plan.rels[k], present.get(plan.rels[k])))
        timings["manifest"], cpu["manifest"] = time.perf_counter() - start, time.process_time() - start_cpu
        start, start_cpu = time.perf_counter(), time.process_time()
        result = staging.InputResult("cosmo", "local", tmp, str(staging_dir), len(entries), len(plan.node_idx))
        staging._write_file_lists(plan, staging._Dirs(Path(tmp), staging_dir, staging_dir), result)
        timings["file lists"], cpu["file lists"] = time.perf_counter() - start, time.process_time() - start_cpu
    return {"blobs": len(entries), "nodes": nodes, "ranks_per_node": ranks, "node0_files": len(plan.node_idx),
            "finished": finished, "seconds": {k: round(v, 3) for k, v in timings.items()},
            "cpu_seconds": {k: round(v, 3) for k, v in cpu.items()},
            "total_s": round(sum(timings.values()), 3), "total_cpu_s": round(sum(cpu.values()), 3),
            "max_rss_mib": round(peak_rss_kib() / 1024, 1)}


def peak_rss_kib() -> int:
    """This process's peak resident set (VmHWM). Not getrusage's ru_maxrss: Linux carries that
    across exec, so a process started by a large parent would report the parent's size."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.listing", description=__doc__.splitlines()[0])
    parser.add_argument("--blobs", type=int, default=1_000_000)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=8, help="local ranks per node")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = measure(args.blobs, args.nodes, args.ranks)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['blobs']:,} blobs, node 0 of {args.nodes} x {args.ranks} ranks: "
              + ", ".join(f"{k} {v:.2f}s" for k, v in result["seconds"].items())
              + f"; total {result['total_s']:.2f}s wall, {result['total_cpu_s']:.2f}s CPU ("
              + ", ".join(f"{k} {v:.2f}" for k, v in result["cpu_seconds"].items())
              + f"); max RSS {result['max_rss_mib']:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
