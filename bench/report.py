"""bench/staging.py's results as the markdown of bench/RESULTS.md: every figure, each target against it."""

from __future__ import annotations

MB = 1e6


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _table(rows: dict, per_file: bool = False) -> list[str]:
    head = "| measurement | median s | MB/s | runs (s) | client CPU s | core-s/GB |"
    rule = "|---|---:|---:|---|---:|---:|"
    if per_file:
        head, rule = head + " CPU-ms/file |", rule + "---:|"
    lines = [head + " Azurite CPU s | what |", rule + "---:|---|"]
    for row in rows.values():
        runs = ", ".join(f"{s:.2f}" for s in row["runs_s"])
        extra = f" {row['cpu_ms_per_file']:.2f} |" if per_file else ""
        lines.append(f"| {row['name']} | {row['median_s']:.2f} | {row['mb_per_s']:.0f} | {runs} | {row['cpu_s']:.2f} | "
                     f"{row['core_s_per_gb']:.2f} |{extra} {row['server_cpu_s']:.2f} | {row['note']} |")
    return lines


def _floor(f: dict) -> list[str]:
    rows = f["rows"]
    staging = rows["staging"]["core_s_per_gb"]
    cpu, speed = f["cpu_vs_sdk"], f["speed_vs_sdk"]
    return [
        "## 1. CPU per byte (the CPU floor)",
        "",
        f"{f['files']} CosmoFlow-like files (sizes +-50%), {f['bytes'] / MB:.1f} MB, stored gzip-encoded as "
        f"{f['stored_bytes'] / MB:.1f} MB (ratio {f['bytes'] / f['stored_bytes']:.2f}).",
        "",
        *_table(rows),
        "",
        f"- staging's client CPU vs the SDK baseline: **{cpu:.2f}x** (target <= 1.05x): {_met(cpu <= 1.05)}",
        f"- staging's speed vs the SDK baseline: **{speed:.2f}x** (target >= 1.6x): {_met(speed >= 1.6)}",
        f"- vs sequential, unverified: {f['cpu_vs_sequential']:.2f}x the CPU, {f['speed_vs_sequential']:.2f}x the speed",
        f"- stages alone, core-s/GB: download {rows['download alone']['core_s_per_gb']:.2f} + inflate "
        f"{rows['inflate alone']['core_s_per_gb']:.2f} + write {rows['write alone']['core_s_per_gb']:.2f} = "
        f"{f['stage_sum_core_s_per_gb']:.2f}; staging {staging:.2f}, "
        f"{staging - f['stage_sum_core_s_per_gb']:+.2f} core-s/GB ({staging / f['stage_sum_core_s_per_gb']:.2f}x) "
        f"from their sum; the stored digest alone costs {rows['stored digest alone']['core_s_per_gb']:.2f}",
        "",
    ]


def _big(b: dict) -> list[str]:
    alone, one = b["vs_inflate_alone"], b["vs_one_stream"]
    return [
        "## 2. One large file, inflated in parallel",
        "",
        f"One file of {b['bytes'] / MB:.0f} MB ({b['stored_bytes'] / MB:.0f} MB stored as one stream).",
        "",
        *_table(b["rows"]),
        "",
        f"- staged as members vs staged as one stream (single-stream inflate, as every file staged before "
        f"members): **{one:.2f}x** faster (target >= 1.7x): {_met(one >= 1.7)}",
        f"- staged as members vs single-stream inflate alone (in memory: no download, no write): {alone:.2f}x",
        "",
    ]


def _small(s: dict) -> list[str]:
    ms = s["rows"]["staging"]["cpu_ms_per_file"]
    return [
        "## 3. Many small files",
        "",
        f"{s['files']} files of {s['bytes'] / s['files'] / 1024:.0f} KiB.",
        "",
        *_table(s["rows"], per_file=True),
        "",
        f"- staging: **{ms:.2f} client CPU-ms per file** (target < 1.5): {_met(ms < 1.5)}; "
        f"{s['files'] / s['rows']['staging']['median_s']:.0f} files/s",
        "",
    ]


def _listing(x: dict) -> list[str]:
    cpu, wall, rss = x["total_cpu_s"], x["total_s"], x["max_rss_mib"]
    steps = ", ".join(f"{k} {v:.2f}" for k, v in x["cpu_seconds"].items())
    walls = ", ".join(f"{k} {v:.2f}" for k, v in x["seconds"].items())
    return [
        "## 4. A million blobs: listing, assignment, resume",
        "",
        f"{x['blobs']:,} blobs (generated List Blobs pages, bench/listing.py), node 0 of {x['nodes']} x "
        f"{x['ranks_per_node']} ranks ({x['node0_files']:,} files, all recorded as finished in the manifest).",
        "",
        f"- CPU s: {steps}; **total {cpu:.2f} s** (target < 10 s): {_met(cpu < 10)}",
        f"- wall s: {walls}; total {wall:.2f} s ({_met(wall < 10)} on the wall clock of this run)",
        f"- peak RSS: **{rss:.0f} MiB** (target < 1024): {_met(rss < 1024)}",
        "",
    ]


def render_staging(r: dict) -> str:
    m = r["machine"]
    lines = [
        "# Staging benchmark",
        "",
        f"Command: `{r['command']}` (`make bench`), {r['date']}. Written by bench/staging.py; each figure is the "
        "median of interleaved repeats. Client CPU is the staging process's own CPU time (all its threads); "
        "Azurite's is shown apart.",
        "",
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['mem_gib']} GiB RAM, Python {m['python']}, {m['platform']}; "
        f"inflate: {m['inflate']}; stored-bytes digest used: {m['stored_digest']}; Azurite {m['azurite']} on the "
        f"same machine. Load average before/after: {r['load_before']} / {m['load_after']}.",
        "",
    ]
    for key, part in (("floor", _floor), ("big", _big), ("small", _small), ("listing", _listing)):
        if key in r:
            lines += part(r[key])
    return "\n".join(lines)
