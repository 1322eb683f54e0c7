"""Parallel inflate of one large file, decided against a server that costs little CPU per byte.

    python -m bench.inflate [--mib 512] [--repeats 5] [--server nginx|memory] [--write-dir DIR] [--skip-azurite]
                            [--out bench/out]

On two vCPUs that also run Azurite, the members path (amlhpc.jobs.runtime.blob.gzmembers: one file
uploaded as independent gzip members, fetched by runs and inflated on every core) was
measured at 1.04x one stream (bench/RESULTS.md part 2): Azurite, a Node.js server, spends
about a core serving the bytes, so the second inflate thread has nowhere to run. Here the
same blob bytes are served by a server that costs little CPU per byte, so the figure
says what the members path does when the cores are the client's:

- `nginx` (Debian's nginx-light, `apt-get install nginx-light`): the stored bytes as a
  file, sent with sendfile(2); staging's reader asks for ranges with the Blob API's
  `x-ms-range`, which nginx's static module does not read, so a second nginx server in
  front copies it into `Range` (proxy_pass over a kept-alive local connection, unbuffered);
- `memory`: an in-process server (http.server, threads) answering ranges from bytes in
  memory, for machines without nginx; its CPU is then part of the client's.

Measured, interleaved, `--repeats` times each, medians (wall and CPU):

1. reference, bytes in memory: isal's decompressobj inflating the file's members, two
   halves on two threads against all of them on one thread (what two cores give at best);
2. the low-CPU server: `Fetcher.fetch` of the members blob (runs of members, inflated on
   the inflate pool, one thread per CPU) against `Fetcher.fetch` of the same file stored
   as one gzip stream (inflated in order on one thread); both verified as staging
   verifies (stored digest, every member's CRC-32 and length, sizes). Target: members
   >= 1.8x faster;
3. end to end against Azurite (the same run, `--skip-azurite` leaves it out): staging
   (`stage_inputs`) of both blobs, as bench.staging part 2 does.

Files are written where `--write-dir` says (default: the bench's temp directory, on disk).
On a machine whose disk and page cache are shared with other busy tenants, writing 0.5 GB
a run swings the timings of both paths by 2x; `--write-dir /dev/shm` (tmpfs: the same
page-cache copy, no ext4 or writeback) isolates the inflate, which is what this decides.

Writes `--out`/inflate.md and inflate.json.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.server
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from amlhpc.jobs.data import upload
from amlhpc.jobs.local import azurite as azurite_server
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.base.ranks import validated
from amlhpc.jobs.runtime.blob import blobhttp, blobio, gzmembers
from amlhpc.jobs.runtime.blob.fetch import INFLATE_LIBRARY, BlobEntry, Fetcher
from amlhpc.jobs.runtime.staging import stager as staging
from bench.dataset import generate
from bench.machine import describe_machine, loadavg
from bench.staging import Measurement, interleaved

MB = 1e6
ROOT = Path(__file__).resolve().parents[1]
CONTAINER = "bench"


@dataclass
class StoredBlob:
    name: str
    data: bytes
    metadata: dict[str, str]

    def entry(self) -> BlobEntry:
        md5 = base64.b64encode(hashlib.md5(self.data).digest()).decode()
        return BlobEntry.with_metadata(self.name, len(self.data), self.metadata, etag=None,
                                       content_encoding="gzip", content_md5=md5)


class NoAuth:
    """The low-CPU servers want no SAS and no token."""

    def apply(self, headers: dict[str, str]) -> str:
        return ""


# ------------------------------------------------------------------ the two servers


@dataclass
class NginxServer:
    """nginx serving `root` (see the module docstring); `pids` for reading its CPU time."""

    workdir: Path
    port: int = 0
    process: subprocess.Popen | None = None
    pids: list[int] = field(default_factory=list)

    def start(self) -> NginxServer:
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(nginx).exists():
            raise FileNotFoundError("nginx is not installed (apt-get install nginx-light), or use --server memory")
        self.port, inner = azurite_server.free_port(), azurite_server.free_port()
        for sub in ("tmp", "logs"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        temps = "".join(f"{kind}_temp_path {self.workdir}/tmp/{kind};\n"
                        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        conf = self.workdir / "nginx.conf"
        conf.write_text(f"""daemon off;
master_process off;
worker_processes 1;
pid {self.workdir}/nginx.pid;
error_log {self.workdir}/logs/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    default_type application/octet-stream;
    sendfile on;
    keepalive_requests 1000000;
    {temps}
    upstream files {{ server 127.0.0.1:{inner}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{inner};
        root {self.workdir}/root;
    }}
    server {{
        listen 127.0.0.1:{self.port};
        location / {{
            proxy_pass http://files;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Range $http_x_ms_range;
            proxy_buffering off;
            proxy_buffer_size 1m;
            proxy_buffers 4 1m;
            proxy_busy_buffers_size 2m;
        }}
    }}
}}
""")
        self.process = subprocess.Popen([nginx, "-c", str(conf), "-p", str(self.workdir)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"nginx exited: {self.process.stderr.read().decode()[:500]}") from None
                time.sleep(0.05)
        self.pids = [self.process.pid]
        return self

    def put(self, name: str, data: bytes) -> None:
        path = self.workdir / "root" / CONTAINER / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def cpu(self) -> float:
        return sum(_process_cpu(pid) for pid in self.pids)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{CONTAINER}"

    name = "nginx (sendfile, behind an nginx that maps x-ms-range to Range)"


class MemoryServer:
    """Ranges of in-memory blobs over HTTP/1.1 keep-alive, on threads of this process."""

    name = "in-process http.server from memory (its CPU counts as the client's)"

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> MemoryServer:
        blobs = self.blobs

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                data = blobs.get(self.path.split("?", 1)[0].split(f"/{CONTAINER}/", 1)[-1])
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                first, _, last = self.headers.get("x-ms-range", "bytes=0-").split("=", 1)[1].partition("-")
                start, end = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
                self.send_response(206)
                self.send_header("Content-Length", str(end - start + 1))
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                self.end_headers()
                self.wfile.write(memoryview(data)[start:end + 1])

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def put(self, name: str, data: bytes) -> None:
        self.blobs[name] = data

    def cpu(self) -> float:
        return 0.0

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{CONTAINER}"


def _process_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


# ------------------------------------------------------------------ the measurements


def make_blobs(workdir: Path, mib: float) -> tuple[int, StoredBlob, StoredBlob]:
    """One CosmoFlow-like file compressed as members (the uploader's default) and as one stream."""
    source = workdir / "source"
    generate(source, files_per_universe=1, file_bytes=int(mib * (1 << 20)), seed=11)
    (path,) = source.iterdir()
    raw = path.read_bytes()
    writer = gzmembers.MemberWriter(upload.DEFAULT_LEVEL, gzmembers.member_size_for(len(raw)),
                                    compressobj=lambda: upload.compressor(upload.DEFAULT_LEVEL))
    members = writer.feed(raw) + writer.finish()
    one = upload.compressor(upload.DEFAULT_LEVEL)
    stream = one.compress(raw) + one.flush()

    def meta(data: bytes, sizes: list[int] | None) -> dict[str, str]:
        found = {"amlhpc_size": str(len(raw)), "amlhpc_sha256": hashlib.sha256(raw).hexdigest(),
                 "amlhpc_stored_sha256": hashlib.sha256(data).hexdigest()}
        if sizes:
            found.update({gzmembers.META_MEMBER_BYTES: str(writer.member_bytes),
                          gzmembers.META_MEMBERS: gzmembers.encode_index(sizes)})
        return found

    return (len(raw), StoredBlob(f"members/{path.name}.gz", members, meta(members, writer.sizes)),
            StoredBlob(f"onestream/{path.name}.gz", stream, meta(stream, None)))


def reference(size: int, members: StoredBlob, one: StoredBlob) -> list[Measurement]:
    """isal alone on bytes in memory: the members on two threads (two halves), then on one."""
    from isal import isal_zlib

    sizes = gzmembers.decode_index(members.metadata[gzmembers.META_MEMBERS])
    offsets = [0]
    for length in sizes:
        offsets.append(offsets[-1] + length)
    view = memoryview(members.data)
    spans = [view[offsets[k]:offsets[k + 1]] for k in range(len(sizes))]  # no copies: the index says where
    halves = [spans[:len(spans) // 2], spans[len(spans) // 2:]]

    def inflate_members(part: list[memoryview]) -> int:
        return sum(len(isal_zlib.decompressobj(wbits=31).decompress(span)) for span in part)

    def two_threads() -> None:
        with ThreadPoolExecutor(2) as pool:
            assert sum(pool.map(inflate_members, halves)) == size

    def one_thread() -> None:
        assert inflate_members(spans) == size

    return [Measurement("isal, 2 threads, members in memory", "decompressobj per member, two halves", two_threads),
            Measurement("isal, 1 thread, members in memory", "the same members one after another", one_thread)]


def fetches(server, size: int, members: StoredBlob, one: StoredBlob, scratch: Path) -> list[Measurement]:
    cpus = os.cpu_count() or 2
    retry = blobio.RetrySettings.fast()
    reader = blobhttp.Reader(server.url, NoAuth(), retry)

    def run(blob: StoredBlob) -> None:
        scratch.mkdir(parents=True, exist_ok=True)
        final, partial = scratch / "out.bin", scratch / "out.partial"
        with ThreadPoolExecutor(32, thread_name_prefix="blob-get") as http_pool, \
                ThreadPoolExecutor(cpus, thread_name_prefix="inflate") as inflate_pool:
            fetcher = Fetcher(reader, http_pool, inflate_pool, retry_pause_s=0.01)
            result = fetcher.fetch(blob.entry(), final, partial)
        assert result.bytes_out == size, result
        final.unlink()

    runs = [Measurement("members, low-CPU server", f"Fetcher: runs of members, inflated on {cpus} threads",
                        lambda: run(members)),
            Measurement("one stream, low-CPU server", "Fetcher: ranges in order, inflated on one thread",
                        lambda: run(one))]
    return runs


def interleaved_with_server(runs: list[Measurement], repeats: int, server) -> dict[str, list[float]]:
    """`interleaved`, also reading the low-CPU server's CPU per run."""
    spent: dict[str, list[float]] = {m.name: [] for m in runs}
    for m in runs:
        inner = m.fn

        def timed(inner=inner, name=m.name) -> None:
            before = server.cpu()
            inner()
            spent[name].append(server.cpu() - before)
        m.fn = timed
    interleaved(runs, repeats, os.getpid())
    return spent


def azurite_end_to_end(workdir: Path, size: int, members: StoredBlob, one: StoredBlob, repeats: int,
                       write_dir: Path) -> list[Measurement]:
    """staging of both blobs against Azurite (bench.staging part 2's figure, in this run)."""
    from azure.storage.blob import ContentSettings

    runs: list[Measurement] = []
    server = azurite_server.start(workdir / "azurite")
    try:
        container = blobio.container_client(CONTAINER, connection_string=server.connection_string,
                                            retry=blobio.RetrySettings.fast(), max_connections=64)
        container.create_container()
        for blob in (members, one):
            container.upload_blob(blob.name, blob.data, metadata=blob.metadata, max_concurrency=4,
                                  content_settings=ContentSettings(content_encoding="gzip"))

        def stage(prefix: str) -> None:
            scratch = write_dir / f"stage-{time.monotonic_ns()}"
            env = {contract.BLOB_CONNECTION_STRING: server.connection_string, contract.SCRATCH: str(scratch),
                   contract.REPORT_DIR: str(workdir / "reports"), contract.RUN_ID: f"bench-{time.monotonic_ns()}"}
            spec = staging.StageSpec("data", CONTAINER, prefix=prefix)
            result = staging.stage_inputs([spec], validated(0, 0, 1, 1), env=env, options=staging.StageOptions(
                retry=blobio.RetrySettings.fast(), progress_interval_s=3600))
            assert result.bytes_out == size
            shutil.rmtree(scratch)

        runs = [Measurement("members, Azurite", "stage_inputs, members", lambda: stage("members")),
                Measurement("one stream, Azurite", "stage_inputs, one stream", lambda: stage("onestream"))]
        interleaved(runs, repeats, server.process.pid)
    finally:
        server.stop()
    return runs


# ------------------------------------------------------------------ report


def render(results: dict) -> str:
    def row(r: dict) -> str:
        server = f"{r['server_cpu_s']:.2f}" if r.get("server_cpu_s") is not None else "-"
        return (f"| {r['name']} | {r['median_s']:.2f} | {', '.join(f'{x:.2f}' for x in r['runs_s'])} | "
                f"{r['cpu_s']:.2f} | {server} | {r['mb_per_s']:.0f} |")

    head = ("| run | median s | runs s | client CPU s | server CPU s | MB/s out |\n"
            "|---|---:|---|---:|---:|---:|")
    lines = [f"### Parallel inflate of one {results['bytes'] / MB:,.0f} MB file ({results['stored_members'] / MB:,.0f} MB "
             f"stored as members, {results['stored_one'] / MB:,.0f} MB as one stream)", "",
             f"`{results['command']}`, {results['date']}; {results['machine']['cpus']} vCPUs "
             f"({results['machine']['cpu']}), load average {results['load_before']} before and "
             f"{results['machine']['load_after']} after; inflate with {results['machine']['inflate']}; low-CPU "
             f"server: {results['server']}; files written to {results['write_dir']}.", "", head]
    lines += [row(r) for r in results["rows"]]
    lines += ["", f"- isal alone, bytes in memory: 2 threads {results['reference_speedup']:.2f}x one",
              f"- **members vs one stream, low-CPU server: {results['speedup']:.2f}x** (target 1.8x: "
              f"{'met' if results['speedup'] >= 1.8 else 'missed'})"]
    if "azurite_speedup" in results:
        lines.append(f"- members vs one stream, Azurite (end to end, staging): {results['azurite_speedup']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inflate", description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=512.0, help="MiB of the large file")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--server", choices=("nginx", "memory"), default="nginx" if shutil.which("nginx") or
                        Path("/usr/sbin/nginx").exists() else "memory")
    parser.add_argument("--skip-azurite", action="store_true", help="leave out the end-to-end runs against Azurite")
    parser.add_argument("--write-dir", type=Path, help="where fetched and staged files are written (default: the "
                        "bench's temp directory; /dev/shm keeps the disk out of the figure)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="amlhpc-inflate-"))
    write_dir = Path(tempfile.mkdtemp(prefix="amlhpc-inflate-out-", dir=args.write_dir)) if args.write_dir else workdir
    results: dict = {"command": "python -m bench.inflate " + " ".join(sys.argv[1:] if argv is None else argv),
                     "load_before": loadavg(), "date": time.strftime("%Y-%m-%d %H:%M %Z"),
                     "write_dir": str(args.write_dir or "the bench's temp directory (disk)")}
    server = NginxServer(workdir / "nginx") if args.server == "nginx" else MemoryServer()
    try:
        size, members, one = make_blobs(workdir, args.mib)
        results.update(bytes=size, stored_members=len(members.data), stored_one=len(one.data), server=server.name)
        server.start()
        for blob in (members, one):
            server.put(blob.name, blob.data)
        print("reference and low-CPU server: ...", file=sys.stderr)
        runs = [*reference(size, members, one), *fetches(server, size, members, one, write_dir / "out")]
        spent = interleaved_with_server(runs, args.repeats, server)
        server.stop()
        rows = []
        for m in runs:
            row = m.row(size)
            row["server_cpu_s"] = statistics.median(spent[m.name]) if args.server == "nginx" and "server" in m.name \
                else None
            rows.append(row)
        if not args.skip_azurite:
            print("Azurite, end to end: ...", file=sys.stderr)
            rows += [m.row(size) for m in azurite_end_to_end(workdir, size, members, one, args.repeats, write_dir)]
        by = {r["name"]: r for r in rows}
        results["rows"] = rows
        results["reference_speedup"] = (by["isal, 1 thread, members in memory"]["median_s"]
                                        / by["isal, 2 threads, members in memory"]["median_s"])
        results["speedup"] = by["one stream, low-CPU server"]["median_s"] / by["members, low-CPU server"]["median_s"]
        if "members, Azurite" in by:
            results["azurite_speedup"] = by["one stream, Azurite"]["median_s"] / by["members, Azurite"]["median_s"]
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(write_dir, ignore_errors=True)
    results["machine"] = {**describe_machine(), "load_after": loadavg(), "inflate": INFLATE_LIBRARY}
    text = render(results)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "inflate.md").write_text(text + "\n")
    (args.out / "inflate.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
