"""The health gate's GEMM on one GPU, beside what moves it: data, duration, shape, clocks.

    python -m bench.gpu_gemm [--seconds 20] [--json OUT.json]

Runs the gate's own measurer (amlhpc/jobs/runtime/health/measure.py) at the catalog's mark shape
(ND H100/H200 v5: bf16 2048x2048x13312): a burst (fastest iterations) and the sustained
loop the mark is checked with, on random operands as the gate uses and on zeros (a GPU
draws less power multiplying zeros, so a mark measured on constant data reads higher), and
a square 8192 product for comparison. While each runs, NVML is read every 0.25 s through
the telemetry reader (amlhpc/jobs/runtime/node/telemetry.py): SM clock, power, temperature and the
clock event reasons, so a figure below the mark can be told from a power or thermal cap.
Needs a CUDA GPU, PyTorch and the NVML bindings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import Counter

from amlhpc.jobs.runtime.health.measure import TorchGpuMeasurer
from amlhpc.jobs.runtime.node.telemetry import GpuReader

MARK_SHAPE = (2048, 2048, 13312)
SQUARE = (8192, 8192, 8192)


class ZerosMeasurer(TorchGpuMeasurer):
    """The gate's measurer with all-zero operands."""

    def _gemm_operands(self, index, dtype, shape):
        torch = self.torch
        m, n, k = shape
        device = torch.device("cuda", index)
        kind = torch.bfloat16
        return (torch.zeros(m, k, device=device, dtype=kind), torch.zeros(k, n, device=device, dtype=kind),
                torch.empty(m, n, device=device, dtype=kind))


def _sampled(run):
    """`run()`'s result and the NVML samples taken while it ran."""
    reader = GpuReader()
    samples: list[dict] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.25):
            gpus = reader.read()
            if gpus:
                samples.append(gpus[0])

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        result = run()
    finally:
        stop.set()
        thread.join()
        reader.close()
    return result, samples


def _summary(samples: list[dict]) -> dict:
    busy = [s for s in samples if s.get("util_percent", 0) > 50] or samples
    reasons = Counter(r for s in busy for r in s.get("throttle_reasons", []))

    def median(key: str) -> float | None:
        values = [s[key] for s in busy if key in s]
        return round(statistics.median(values), 1) if values else None

    return {"samples": len(busy), "sm_clock_mhz": median("sm_clock_mhz"), "power_w": median("power_w"),
            "power_limit_w": median("power_limit_w"), "temperature_c": median("temperature_c"),
            "reasons": {k: round(v / len(busy), 2) for k, v in reasons.most_common()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_gemm", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="each sustained run (default 20)")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    random, zeros = TorchGpuMeasurer(), ZerosMeasurer()
    if random.unavailable_reason:
        print(f"bench.gpu_gemm: {random.unavailable_reason}", file=sys.stderr)
        return 2
    rows = []

    def record(what: str, measurer, shape, sustained: bool) -> None:
        start = time.perf_counter()
        if sustained:
            rate, samples = _sampled(lambda: measurer.gemm_sustained_tflops([0], "bf16", shape, args.seconds, 3.0)[0])
        else:
            flops = 2 * shape[0] * shape[1] * shape[2]
            iters = max(10, int(300e12 / flops))  # about a second at the mark's rate
            rate, samples = _sampled(lambda: measurer.gemm_tflops(0, "bf16", shape, iters))
        if isinstance(rate, Exception):
            raise rate
        row = {"what": what, "shape": list(shape), "tflops": round(rate, 1),
               "seconds": round(time.perf_counter() - start, 1), **_summary(samples)}
        rows.append(row)
        print(json.dumps(row), flush=True)

    record("burst, random (the gate's --quick)", random, MARK_SHAPE, sustained=False)
    record("sustained, random (the gate)", random, MARK_SHAPE, sustained=True)
    record("sustained, zeros", zeros, MARK_SHAPE, sustained=True)
    record("burst, zeros", zeros, MARK_SHAPE, sustained=False)
    record("sustained, random, 8192 cube", random, SQUARE, sustained=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"device": random.device_name(0), "rows": rows}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
