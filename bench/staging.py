"""Staging's CPU per byte and speed against Azurite, next to the SDK and each stage alone.

    python -m bench.staging [--repeats 5] [--files 128 --file-mib 4] [--big-mib 1024]
                            [--small-files 20000 --small-kib 8] [--listing-blobs 1000000]
                            [--skip floor,big,small,listing] [--out bench/out] [--update-results]

Why CPU per byte: on an ND node the NIC brings gzip faster than one core inflates it, so
staging is CPU-bound there too and core-seconds per GB decide a node's staging rate.
Client CPU is this process's CPU time (time.process_time: every thread; staging runs in
this process), Azurite's is read from /proc and shown apart: on a node the server is not
ours to pay for. Every measurement repeats `--repeats` times, interleaved with the others
(so a burst of load elsewhere hits every kind alike), and the median is reported.

1. The CPU floor, on a CosmoFlow-like dataset (bench/dataset.py, sizes +-50%):
   - staging: `stage_inputs` with its defaults, full verification (a digest of the stored
     bytes, gzip CRC-32 and sizes: every byte);
   - the SDK baseline: per file `download_blob(max_concurrency=8).readall()` on a default
     ContainerClient, isal's inflate, write; it verifies nothing;
   - sequential, unverified: per file one GET through the same transport as before,
     inflate, write;
   - each stage alone: download (staging's reader, as many GETs at once as staging),
     inflate (isal on every core, blobs in memory), write (new files, as many writers as
     staging), and the stored-bytes digest staging computes;
   - targets: staging <= 1.05x the SDK baseline's client CPU and >= 1.6x its speed; and
     staging's distance from the sum of its stages.
2. Parallel inflate: one `--big-mib` file uploaded as gzip members (the default) and as
   one stream (as uploads before members did), both staged, and the one stream inflated
   alone on one core. Target: members stage >= 1.7x faster than single-stream inflate.
3. Many small files: `--small-files` of `--small-kib` staged; client CPU-ms per file,
   next to the SDK (one `download_blob` per file, on the first 2,000). Target < 1.5 ms.
4. Listing, planning and resuming `--listing-blobs` blobs (bench/listing.py, in a process
   of its own for its peak memory). Target: < 10 s, < 1 GB.

Results go to `--out` (bench/out/staging.md and .json, git-ignored); `--update-results`
also writes them into bench/RESULTS.md, keeping its hand-written part.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from amlhpc.jobs.data import upload
from amlhpc.jobs.local import azurite as azurite_server
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.base.ranks import validated
from amlhpc.jobs.runtime.blob import blobhttp, blobio
from amlhpc.jobs.runtime.blob.fetch import INFLATE_LIBRARY, Gunzip, sha256_is_faster
from amlhpc.jobs.runtime.staging import stager as staging
from bench.dataset import generate
from bench.machine import azurite_version, describe_machine, loadavg

MB = 1e6
ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).with_name("RESULTS.md")
MARKER = "<!-- analysis -->"


# ------------------------------------------------------------------ measuring


@dataclass
class Measurement:
    name: str
    note: str
    fn: Callable[[], object]
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    """Client CPU: this process."""
    server_cpu: list[float] = field(default_factory=list)
    """Azurite's CPU during the run."""

    def median(self, what: str) -> float:
        return statistics.median(getattr(self, what))

    def row(self, output_bytes: int, files: int | None = None) -> dict:
        wall, cpu = self.median("wall"), self.median("cpu")
        row = {"name": self.name, "note": self.note, "median_s": wall, "runs_s": self.wall, "cpu_s": cpu,
               "server_cpu_s": self.median("server_cpu"), "mb_per_s": output_bytes / MB / wall,
               "core_s_per_gb": cpu / (output_bytes / 1e9)}
        if files:
            row["cpu_ms_per_file"] = cpu * 1000 / files
        return row


def _server_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def interleaved(measurements: list[Measurement], repeats: int, server_pid: int) -> None:
    """Run every measurement `repeats` times, one after another in turn."""
    for repeat in range(repeats):
        for m in measurements:
            server, cpu, start = _server_cpu(server_pid), time.process_time(), time.perf_counter()
            m.fn()
            m.wall.append(time.perf_counter() - start)
            m.cpu.append(time.process_time() - cpu)
            m.server_cpu.append(_server_cpu(server_pid) - server)
            print(f"  [{repeat + 1}/{repeats}] {m.name}: {m.wall[-1]:.2f}s wall, {m.cpu[-1]:.2f}s client CPU",
                  file=sys.stderr)


# ------------------------------------------------------------------ the runs


@dataclass
class Bench:
    server: azurite_server.Azurite
    workdir: Path
    container: object
    retry: blobio.RetrySettings = field(default_factory=blobio.RetrySettings.fast)

    def scratch(self, tag: str) -> Path:
        return self.workdir / f"{tag}-{uuid.uuid4().hex[:6]}"

    def stage(self, prefix: str, expect_bytes: int, **options) -> Callable[[], None]:
        def run() -> None:
            scratch = self.scratch("stage")
            env = {contract.BLOB_CONNECTION_STRING: self.server.connection_string, contract.SCRATCH: str(scratch),
                   contract.REPORT_DIR: str(self.workdir / "reports"), contract.RUN_ID: uuid.uuid4().hex}
            spec = staging.StageSpec("data", self.container.container_name, prefix=prefix)
            result = staging.stage_inputs([spec], validated(0, 0, 1, 1), env=env, options=staging.StageOptions(
                retry=self.retry, progress_interval_s=3600, **options))
            assert result.bytes_out == expect_bytes, (result.bytes_out, expect_bytes)
            shutil.rmtree(scratch)
        return run

    def sdk_baseline(self, names: list[str]) -> Callable[[], None]:
        """What a user writes: a default client, download_blob(max_concurrency=8).readall(), isal, write."""
        from azure.storage.blob import ContainerClient
        from isal import isal_zlib

        client = ContainerClient.from_connection_string(self.server.connection_string, self.container.container_name)

        def run() -> None:
            out = self.scratch("sdk")
            out.mkdir()
            for name in names:
                data = client.get_blob_client(name).download_blob(max_concurrency=8, decompress=False).readall()
                (out / Path(name).name).write_bytes(isal_zlib.decompress(data, wbits=31))
            shutil.rmtree(out)
        return run

    def sequential(self, names: list[str]) -> Callable[[], None]:
        """One file after another: GET (staging's transport), inflate, write; nothing verified."""
        reader = self.reader()
        sizes = {b.name: b.size for b in self.container.list_blobs()}

        def run() -> None:
            out = self.scratch("seq")
            out.mkdir()
            for name in names:
                data, _ = reader.get(name, 0, sizes[name])
                gunzip = Gunzip(name)
                with open(out / Path(name).name, "wb") as handle:
                    for piece in gunzip.feed(data):
                        handle.write(piece)
            shutil.rmtree(out)
        return run

    def reader(self) -> blobhttp.Reader:
        url, auth = blobhttp.auth_from_env(self.container.container_name, None,
                                           {contract.BLOB_CONNECTION_STRING: self.server.connection_string})
        return blobhttp.Reader(url, auth, self.retry)


def stage_alone_runs(bench: Bench, names: list[str], stored: dict[str, bytes], raw: list[bytes],
                     options: staging.StageOptions) -> list[Measurement]:
    """Each of staging's stages on its own, with the parallelism staging gives it."""
    reader = bench.reader()
    cpus = os.cpu_count() or 1

    def download() -> None:
        with ThreadPoolExecutor(options.concurrency) as pool:
            got = sum(pool.map(lambda n: len(reader.get(n, 0, len(stored[n]))[0]), names))
        assert got == sum(len(v) for v in stored.values())

    def inflate() -> None:
        def one(data: bytes) -> int:
            gunzip = Gunzip("bench")
            return sum(len(p) for p in gunzip.feed(data)) + len(gunzip.finish())
        with ThreadPoolExecutor(cpus) as pool:
            assert sum(pool.map(one, stored.values())) == sum(len(r) for r in raw)

    def write() -> None:
        out = bench.scratch("write")
        out.mkdir()

        def one(item: tuple[int, bytes]) -> None:
            partial = out / f".{item[0]}.partial"
            partial.write_bytes(item[1])
            os.replace(partial, out / str(item[0]))
        with ThreadPoolExecutor(options.file_workers) as pool:
            list(pool.map(one, enumerate(raw)))
        shutil.rmtree(out)

    kind = "sha256" if sha256_is_faster() else "md5"

    def digest() -> None:
        import hashlib

        for data in stored.values():
            hashlib.new(kind, data).digest()

    return [Measurement("download alone", f"{options.concurrency} GETs at once, bytes discarded", download),
            Measurement("inflate alone", f"{INFLATE_LIBRARY} on {cpus} threads, blobs in memory", inflate),
            Measurement("write alone", f"{options.file_workers} writers, partial file + rename", write),
            Measurement("stored digest alone", f"{kind} of the stored bytes, one thread (part of staging's "
                        "verification)", digest)]


# ------------------------------------------------------------------ the four parts


def floor(bench: Bench, args: argparse.Namespace) -> dict:
    source = bench.workdir / "floor"
    generate(source, universes=max(1, args.files // 64), files_per_universe=min(64, args.files),
             file_bytes=int(args.file_mib * (1 << 20)), size_jitter=0.5, seed=1)
    files = sorted(p for p in source.iterdir() if p.is_file())
    raw = [p.read_bytes() for p in files]
    total = sum(len(r) for r in raw)
    report = upload.upload_directory(bench.container, source, "floor")
    names = [f"floor/{p.name}.gz" for p in files]
    stored = {n: bench.container.download_blob(n, decompress=False).readall() for n in names}
    options = staging.StageOptions().resolved()
    runs = [Measurement("staging", "stage_inputs defaults: a digest of the stored bytes, gzip CRC-32, sizes",
                        bench.stage("floor", total)),
            Measurement("SDK + isal (baseline)", "download_blob(max_concurrency=8).readall(), isal, write; no "
                        "checks", bench.sdk_baseline(names)),
            Measurement("sequential, unverified", "per file: one GET, inflate, write", bench.sequential(names)),
            *stage_alone_runs(bench, names, stored, raw, options)]
    interleaved(runs, args.repeats, bench.server.process.pid)
    rows = {m.name: m.row(total) for m in runs}
    stages = sum(rows[k]["core_s_per_gb"] for k in ("download alone", "inflate alone", "write alone"))
    return {"files": len(files), "bytes": total, "stored_bytes": report.bytes_stored, "rows": rows,
            "stage_sum_core_s_per_gb": stages,
            "cpu_vs_sdk": rows["staging"]["cpu_s"] / rows["SDK + isal (baseline)"]["cpu_s"],
            "speed_vs_sdk": rows["SDK + isal (baseline)"]["median_s"] / rows["staging"]["median_s"],
            "cpu_vs_sequential": rows["staging"]["cpu_s"] / rows["sequential, unverified"]["cpu_s"],
            "speed_vs_sequential": rows["sequential, unverified"]["median_s"] / rows["staging"]["median_s"]}


def big_file(bench: Bench, args: argparse.Namespace) -> dict:
    source = bench.workdir / "big"
    generate(source, files_per_universe=1, file_bytes=int(args.big_mib * (1 << 20)), seed=7)
    (path,) = source.iterdir()
    size = path.stat().st_size
    upload.upload_directory(bench.container, source, "members")
    upload.upload_directory(bench.container, source, "onestream", member_bytes=4096 << 20)
    one = bench.container.download_blob(f"onestream/{path.name}.gz", decompress=False).readall()

    def inflate_alone() -> None:
        gunzip = Gunzip("one")
        assert sum(len(p) for p in gunzip.feed(one)) + len(gunzip.finish()) == size

    runs = [Measurement("staging, members", f"uploaded as {upload.gzmembers.DEFAULT_MEMBER_BYTES >> 20} MiB gzip "
                        "members, inflated on every core", bench.stage("members", size)),
            Measurement("staging, one stream", "the same file uploaded as one gzip stream (as before members)",
                        bench.stage("onestream", size)),
            Measurement("single-stream inflate alone", f"{INFLATE_LIBRARY}, one thread, blob in memory", inflate_alone)]
    interleaved(runs, args.big_repeats, bench.server.process.pid)
    rows = {m.name: m.row(size) for m in runs}
    return {"bytes": size, "stored_bytes": len(one), "rows": rows,
            "vs_inflate_alone": rows["single-stream inflate alone"]["median_s"] / rows["staging, members"]["median_s"],
            "vs_one_stream": rows["staging, one stream"]["median_s"] / rows["staging, members"]["median_s"]}


def small_files(bench: Bench, args: argparse.Namespace) -> dict:
    source = bench.workdir / "small"
    generate(source, universes=-(-args.small_files // 1000), files_per_universe=1000,
             file_bytes=int(args.small_kib * 1024), seed=3)
    files = sorted(source.iterdir())[:args.small_files]
    for extra in sorted(source.iterdir())[args.small_files:]:
        extra.unlink()
    total = sum(p.stat().st_size for p in files)
    started = time.perf_counter()
    upload.upload_directory(bench.container, source, "small", workers=4)
    print(f"  uploaded {len(files)} small files in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    subset = [f"small/{p.name}.gz" for p in files[:2000]]
    runs = [Measurement("staging", f"{len(files)} files", bench.stage("small", total)),
            Measurement("SDK + isal, per file", f"the first {len(subset)} files", bench.sdk_baseline(subset))]
    interleaved(runs, args.small_repeats, bench.server.process.pid)
    rows = {"staging": runs[0].row(total, len(files)), "SDK + isal, per file": runs[1].row(total, len(subset))}
    return {"files": len(files), "bytes": total, "rows": rows}


def listing(args: argparse.Namespace) -> dict:
    done = subprocess.run([sys.executable, "-m", "bench.listing", "--blobs", str(args.listing_blobs), "--json"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


# ------------------------------------------------------------------ report


def render(results: dict) -> str:
    from bench.report import render_staging

    return render_staging(results)


def write_results(text: str, results: dict, out: Path, update: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "staging.md").write_text(text + "\n")
    (out / "staging.json").write_text(json.dumps(results, indent=2) + "\n")
    if update:
        previous = RESULTS.read_text() if RESULTS.exists() else ""
        kept = previous[previous.index(MARKER):] if MARKER in previous else ""
        RESULTS.write_text(text + "\n\n" + kept)


def run(args: argparse.Namespace) -> dict:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="amlhpc-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict = {"command": "python -m bench.staging " + " ".join(sys.argv[1:]), "load_before": loadavg(),
                     "date": time.strftime("%Y-%m-%d %H:%M %Z")}
    parts = [p for p in ("floor", "big", "small", "listing") if p not in args.skip]
    try:
        with azurite_server.start(workdir / "azurite") as server:
            container = blobio.container_client("bench", connection_string=server.connection_string,
                                                retry=blobio.RetrySettings.fast(), max_connections=64)
            container.create_container()
            bench = Bench(server, workdir, container)
            for name, part in (("floor", floor), ("big", big_file), ("small", small_files)):
                if name in parts:
                    print(f"{name}: ...", file=sys.stderr)
                    results[name] = part(bench, args)
        if "listing" in parts:
            print("listing: ...", file=sys.stderr)
            results["listing"] = listing(args)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    results["machine"] = {**describe_machine(), "load_after": loadavg(), "inflate": INFLATE_LIBRARY,
                          "stored_digest": "SHA-256" if sha256_is_faster() else "MD5",
                          "azurite": azurite_version()}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.staging", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each CPU-floor measurement (median)")
    parser.add_argument("--files", type=int, default=128, help="files in the CPU-floor dataset (64 per universe)")
    parser.add_argument("--file-mib", type=float, default=4.0, help="mean MiB per file (+-50%%)")
    parser.add_argument("--big-mib", type=float, default=1024.0, help="MiB of the single large file")
    parser.add_argument("--big-repeats", type=int, default=3)
    parser.add_argument("--small-files", type=int, default=20_000)
    parser.add_argument("--small-kib", type=float, default=8.0)
    parser.add_argument("--small-repeats", type=int, default=3)
    parser.add_argument("--listing-blobs", type=int, default=1_000_000)
    parser.add_argument("--skip", default="", help="comma-separated parts to leave out: floor,big,small,listing")
    parser.add_argument("--workdir", type=Path, help="where data, scratch and Azurite live (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the workdir")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="where staging.md/.json go")
    parser.add_argument("--update-results", action="store_true", help="also write the results into bench/RESULTS.md")
    args = parser.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    results = run(args)
    text = render(results)
    print(text)
    write_results(text, results, args.out, args.update_results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
