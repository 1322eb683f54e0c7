"""Staging throughput against Azurite, next to a naive baseline and each stage alone.

    python -m bench.staging [--files 128] [--file-mib 4] [--repeats 3] [--results bench/RESULTS.md]

One run, one machine, one Azurite:

1. generate a CosmoFlow-named dataset (bench/dataset.py: int16 counts that gzip ~4.8x)
   and measure the compression levels on a sample (ratio, compress and decompress MB/s),
   which is what `jobs data upload`'s default level rests on;
2. upload it with `jobs data upload`'s code (gzip-encoded, with metadata);
3. time, `--repeats` times each, taking the median:
   - staging: `jobs.runtime.staging.stage_inputs` on one node with its defaults (parallel
     ranged downloads, streaming decompression, SHA-256 verification, temp file + rename);
     and the same with the SHA-256 check off (`verify_sha256=False`), to show its cost;
   - naive: one blob after another: download it whole, then decompress, then write. It
     gets the same tuned client and isal's inflate and skips verification, so the gap to
     staging is the pipeline's doing, not a handicap given to the baseline;
   - each stage alone: parallel raw download (bytes discarded), decompression on all
     cores (blobs already in memory), disk write (decompressed bytes already in memory,
     written by as many threads as staging uses), and SHA-256 on all cores.
4. Every figure is reported as decompressed MB/s (10^6 bytes of dataset per second), the
   unit the targets use: staging >= 2x naive, and >= 70% of the slowest stage alone.

Results (numbers, the command, the machine, its load) are written to --results.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bench.dataset import generate, volume_bytes
from jobs.data import upload
from jobs.local import azurite as azurite_server
from jobs.runtime import blobio, contract, staging
from jobs.runtime.fetch import INFLATE_LIBRARY, Gunzip
from jobs.runtime.ranks import validated

MB = 1e6


@dataclass
class Measurement:
    name: str
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    """CPU time of this process, its child processes and Azurite during each run."""
    note: str = ""

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def median_cpu_s(self) -> float:
        return statistics.median(self.cpu_seconds)

    def mb_per_s(self, nbytes: int) -> float:
        return nbytes / MB / self.median_s


def _cpu_now(pid: int) -> float:
    """CPU seconds so far of this process, its reaped children and process `pid` (Azurite)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        pass
    return total


def _timed(fn: Callable[[], object], pid: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one call."""
    cpu = _cpu_now(pid)
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start, _cpu_now(pid) - cpu


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return 0.0


# ------------------------------------------------------------------ compression levels


def _level_row(level: int, sample: bytes) -> dict[str, float | str]:
    comp = upload.compressor(level)
    start = time.perf_counter()
    packed = comp.compress(sample) + comp.flush()
    compress_s = time.perf_counter() - start
    start = time.perf_counter()
    out = b"".join(Gunzip("sample").feed(packed))
    decompress_s = time.perf_counter() - start
    assert out == sample
    return {"level": level, "library": upload.compressor_name(level), "ratio": len(sample) / len(packed),
            "compress_mb_s": len(sample) / MB / compress_s, "decompress_mb_s": len(sample) / MB / decompress_s}


def compression_levels(sample: bytes, levels=(0, 1, 2, 3, 4, 6, 9)) -> list[dict[str, float | str]]:
    return [_level_row(level, sample) for level in levels]


# ------------------------------------------------------------------ the stages


def _decompress_blob(data: bytes) -> int:
    g = Gunzip("bench")
    return sum(len(p) for p in g.feed(data)) + len(g.finish())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run(args: argparse.Namespace) -> dict:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="amlhpc-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = _loadavg()
    print(f"workdir {workdir}; load average {load_before}", file=sys.stderr)
    source = workdir / "source"
    generate(source, universes=max(1, args.files // 64), files_per_universe=min(64, args.files),
             file_bytes=int(args.file_mib * (1 << 20)))
    files = sorted(p for p in source.iterdir() if p.is_file())
    raw = {p.name: p.read_bytes() for p in files}
    total = sum(len(v) for v in raw.values())
    print(f"dataset: {len(files)} files, {total / MB:.1f} MB", file=sys.stderr)

    levels = compression_levels(volume_bytes(12345, min(32 << 20, total)))
    results: dict = {"levels": levels}

    with azurite_server.start(workdir / "azurite") as server:
        retry = blobio.RetrySettings.fast()
        container = blobio.container_client("bench", connection_string=server.connection_string, retry=retry,
                                            max_connections=64)
        container.create_container()
        up_start = time.perf_counter()
        report = upload.upload_directory(container, source, "cosmoflow", level=upload.DEFAULT_LEVEL)
        results["upload"] = {"seconds": time.perf_counter() - up_start, **report.to_json()}
        stored = report.bytes_stored
        print(f"uploaded: {stored / MB:.1f} MB stored (ratio {report.ratio:.2f}) in {results['upload']['seconds']:.1f}s",
              file=sys.stderr)
        blob_names = sorted(b.name for b in container.list_blobs(name_starts_with="cosmoflow/"))
        compressed = {name: container.download_blob(name, decompress=False).readall() for name in blob_names}
        options = staging.StageOptions(retry=retry, progress_interval_s=3600).resolved()
        threads = options.file_workers
        cpus = os.cpu_count() or 1

        def stage(verify: bool) -> Callable[[], object]:
            def go() -> None:
                scratch = workdir / f"scratch-{uuid.uuid4().hex[:6]}"
                env = {contract.BLOB_CONNECTION_STRING: server.connection_string, contract.SCRATCH: str(scratch),
                       contract.REPORT_DIR: str(workdir / "reports"), "AMLHPC_RUN_ID": uuid.uuid4().hex}
                specs = [staging.StageSpec("cosmo", "bench", prefix="cosmoflow", mode="local")]
                result = staging.stage_inputs(specs, validated(0, 0, 1, 1), options=staging.StageOptions(
                    retry=retry, progress_interval_s=3600, verify_sha256=verify), env=env)
                assert result.bytes_out == total, (result.bytes_out, total)
                shutil.rmtree(scratch)
            return go

        def naive() -> None:
            out = workdir / f"naive-{uuid.uuid4().hex[:6]}"
            out.mkdir()
            for name in blob_names:
                data = container.download_blob(name, decompress=False, max_concurrency=1).readall()
                g = Gunzip(name)
                plain = b"".join(g.feed(data)) + g.finish()
                (out / Path(name).name[:-3]).write_bytes(plain)
            shutil.rmtree(out)

        from azure.storage.blob import ContainerClient

        default_client = ContainerClient.from_connection_string(server.connection_string, "bench")

        def naive_sdk_defaults() -> None:
            out = workdir / f"naive-sdk-{uuid.uuid4().hex[:6]}"
            out.mkdir()
            for name in blob_names:
                # what the SDK's quickstart does: its own gzip decoding (zlib), 4 KiB reads
                (out / Path(name).name[:-3]).write_bytes(default_client.download_blob(name).readall())
            shutil.rmtree(out)

        def download_only() -> None:
            with ThreadPoolExecutor(options.concurrency) as pool:
                got = sum(pool.map(lambda n: len(container.download_blob(n, decompress=False, max_concurrency=1).readall()),
                                   blob_names))
            assert got == stored

        def decompress_only() -> None:
            with ProcessPoolExecutor(cpus) as pool:
                assert sum(pool.map(_decompress_blob, compressed.values(), chunksize=4)) == total

        def sha_only() -> None:
            with ProcessPoolExecutor(cpus) as pool:
                list(pool.map(_sha256, raw.values(), chunksize=4))

        def write_only() -> None:
            out = workdir / f"write-{uuid.uuid4().hex[:6]}"
            out.mkdir()

            def put(item: tuple[str, bytes]) -> None:
                (out / item[0]).write_bytes(item[1])

            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(put, raw.items()))
            shutil.rmtree(out)

        plan = [
            ("staging", stage(True), "jobs.runtime.staging defaults: parallel ranges, streaming gunzip, SHA-256, rename"),
            ("staging without SHA-256", stage(False), "same, verify_sha256=False (size and gzip CRC-32 still checked)"),
            ("naive", naive, "sequential: download whole blob, then decompress, then write; no verification; "
                             "same tuned client and isal as staging"),
            ("naive, SDK defaults", naive_sdk_defaults, "sequential `download_blob(name).readall()` with the SDK's "
                                                        "own gzip decoding and default client, then write"),
            ("download alone", download_only, f"{options.concurrency} parallel GETs, bytes discarded"),
            ("decompress alone", decompress_only, f"{INFLATE_LIBRARY} inflate in {cpus} processes, blobs in memory"),
            ("write alone", write_only, f"{threads} threads writing the decompressed files"),
            ("sha256 alone", sha_only, f"hashlib in {cpus} processes (part of staging's work, not a target stage)"),
        ]
        measurements = {name: Measurement(name, note=note) for name, _, note in plan}
        pid = server.process.pid if server.process else -1
        for _ in range(args.repeats):  # interleaved, so a burst of load elsewhere hits every kind alike
            for name, fn, _ in plan:
                wall, cpu = _timed(fn, pid)
                measurements[name].seconds.append(wall)
                measurements[name].cpu_seconds.append(cpu)
                print(f"  {name}: {wall:.2f}s wall, {cpu:.2f}s CPU", file=sys.stderr)

    rows = {name: {"median_s": m.median_s, "seconds": m.seconds, "mb_per_s": m.mb_per_s(total), "note": m.note,
                   "cpu_s": m.median_cpu_s, "core_s_per_gb": m.median_cpu_s / (total / 1e9),
                   # what the run would reach if it had every core of this machine to itself
                   "cpu_bound_mb_per_s": total / MB / (m.median_cpu_s / cpus) if m.median_cpu_s else 0.0}
            for name, m in measurements.items()}
    stages = {k: rows[k]["mb_per_s"] for k in ("download alone", "decompress alone", "write alone")}
    slowest = min(stages, key=stages.get)
    ours = rows["staging"]["mb_per_s"]
    results.update({
        "rows": rows, "slowest_stage": slowest,
        "speedup_vs_naive": ours / rows["naive"]["mb_per_s"],
        "speedup_vs_naive_sdk": ours / rows["naive, SDK defaults"]["mb_per_s"],
        "fraction_of_slowest": ours / stages[slowest],
        "fraction_of_slowest_without_sha": rows["staging without SHA-256"]["mb_per_s"] / stages[slowest],
        "dataset": {"files": len(files), "bytes": total, "stored_bytes": stored, "ratio": total / stored},
        "download_raw_mb_s": stored / MB / rows["download alone"]["median_s"],
        "machine": {"cpu": _cpu_model(), "cpus": cpus, "mem_gib": round(_mem_gib(), 1),
                    "python": platform.python_version(), "platform": platform.platform(),
                    "load_before": load_before, "load_after": _loadavg(), "inflate": INFLATE_LIBRARY,
                    "azurite": _azurite_version()},
        "options": {"concurrency": options.concurrency, "file_workers": options.file_workers,
                    "range_bytes": options.range_bytes, "window": options.window},
        "command": "python -m bench.staging " + " ".join(sys.argv[1:]),
    })
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def _azurite_version() -> str:
    try:
        package = azurite_server.REPO_ROOT / "node_modules" / "azurite" / "package.json"
        return json.loads(package.read_text())["version"]
    except (OSError, KeyError, json.JSONDecodeError):
        return "unknown"


def render(results: dict) -> str:
    rows = results["rows"]
    d = results["dataset"]
    m = results["machine"]
    lines = [
        "# Staging benchmark",
        "",
        f"Command: `{results['command']}` (`make bench`). Written by bench/staging.py; numbers are medians of "
        f"{len(rows['staging']['seconds'])} interleaved repeats.",
        "",
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['mem_gib']} GiB RAM, Python {m['python']}, {m['platform']}; "
        f"inflate: {m['inflate']}; Azurite {m['azurite']} on the same machine. Load average before/after: "
        f"{m['load_before']} / {m['load_after']} (other work shared the CPUs).",
        "",
        f"Dataset: {d['files']} CosmoFlow-named files, {d['bytes'] / MB:.1f} MB, stored gzip-encoded as "
        f"{d['stored_bytes'] / MB:.1f} MB (ratio {d['ratio']:.2f}; NAG's CosmoFlow tutorial: 5.1 TB -> 1.1 TB = 4.6).",
        "",
        "All rates are decompressed MB/s (10^6 bytes of dataset per second). CPU s counts this process, its "
        "worker processes and Azurite; 'MB/s if CPU-bound on all cores' divides the dataset by CPU s / cores, "
        "the ceiling when nothing but CPU limits a run.",
        "",
        "| measurement | median s | MB/s | runs (s) | CPU s | core-s/GB | MB/s if CPU-bound on all cores | what |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for name, row in rows.items():
        runs = ", ".join(f"{s:.2f}" for s in row["seconds"])
        lines.append(f"| {name} | {row['median_s']:.2f} | {row['mb_per_s']:.0f} | {runs} | {row['cpu_s']:.2f} | "
                     f"{row['core_s_per_gb']:.1f} | {row['cpu_bound_mb_per_s']:.0f} | {row['note']} |")
    speedup = results["speedup_vs_naive"]
    fraction = results["fraction_of_slowest"]
    lines += [
        "",
        f"Raw download alone moved {results['download_raw_mb_s']:.0f} MB/s of stored (compressed) bytes.",
        "",
        "## Targets",
        "",
        f"- staging vs naive: **{speedup:.2f}x** (target >= 2x): {'met' if speedup >= 2 else 'MISSED'}; vs the "
        f"SDK-defaults baseline: {results['speedup_vs_naive_sdk']:.2f}x",
        f"- staging vs the slowest stage alone ({results['slowest_stage']}): **{fraction:.0%}** (target >= 70%): "
        f"{'met' if fraction >= 0.7 else 'MISSED'}; without the SHA-256 check: "
        f"{results['fraction_of_slowest_without_sha']:.0%}",
        "",
        "## Compression levels (`jobs data upload --level`)",
        "",
        "| level | library | ratio | compress MB/s (1 core) | decompress MB/s (1 core) |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in results["levels"]:
        lines.append(f"| {row['level']} | {row['library']} | {row['ratio']:.2f} | {row['compress_mb_s']:.0f} | "
                     f"{row['decompress_mb_s']:.0f} |")
    u = results["upload"]
    lines += ["", f"Upload of the dataset (level {upload.DEFAULT_LEVEL}, {u['files']} files): {u['seconds']:.1f}s, "
                  f"{u['mb_per_s']:.0f} MB/s uncompressed in, ratio {u['ratio']:.2f}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.staging", description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=128, help="files in the dataset (64 per universe)")
    parser.add_argument("--file-mib", type=float, default=4.0, help="MiB per file (real CosmoFlow files are ~16)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, help="where data, scratch and Azurite live (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the workdir")
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"),
                        help="markdown report to write ('-' for stdout only)")
    parser.add_argument("--json", type=Path, help="also write the raw results as JSON here")
    args = parser.parse_args(argv)
    results = run(args)
    text = render(results)
    print(text)
    if str(args.results) != "-":
        args.results.write_text(text + "\n" + _explanation_placeholder(args.results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _explanation_placeholder(path: Path) -> str:
    """Keep the hand-written analysis below the generated part when re-running."""
    marker = "<!-- analysis -->"
    if path.exists() and marker in path.read_text():
        return path.read_text()[path.read_text().index(marker):]
    return ""


if __name__ == "__main__":
    raise SystemExit(main())
