"""GPU micro-benchmarks through PyTorch (imported lazily): the "measure" layer.

`GpuMeasurer` is the seam the checks call; `TorchGpuMeasurer` is the real one, a fake
in the tests drives the threshold logic. Every figure is timed with CUDA events after
warm-up, so kernel launch and first-touch costs are excluded:

- GEMM: C = A @ B with (M x K) @ (K x N) matrices in the size's tensor-core dtype (bf16, or
  fp16 on V100), at the shape the size's baseline was measured at; 2 M N K flops per product,
  reported in TFLOP/s (10^12/s), measured the way the size's mark was: "burst" (one GPU at a
  time, each product timed on its own, the median of the 5 fastest, as mamf-finder v4 reports
  its maximum achievable rate) or "sustained" (every GPU at once for the mark's duration, the
  mean rate after a settling period, as Azure's 60-second ubergemm runs; clocks that sag under
  a full node's heat and power show up here and not in a burst).
- P2P: a copy from another GPU's memory into this one (over NVLink where there is one), as
  nvbandwidth's device_to_device_memcpy_read_ce that Azure's health checks grade.
- H2D / D2H: one large copy from / into page-locked (pinned) host memory, as CUDA's
  bandwidthTest does (the NDv4 performance article); GB/s = 10^9 bytes/s. The caller runs it on the CPUs near
  the GPU (the buffer is first touched there, so it lives on the GPU's NUMA node).
- D2D: a copy within the GPU's memory, counted as bytes read + bytes written, as
  bandwidthTest's device-to-device figure is.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Protocol

GIB = 1 << 30
MIB = 1 << 20


class GpuMeasurer(Protocol):
    """What the node checks need from the GPUs (index = CUDA device number)."""

    unavailable_reason: str
    """Why there are no GPUs to measure ("" when there are)."""
    software_missing: bool
    """True when the measuring software (PyTorch) is absent, as opposed to no usable GPU."""

    def device_count(self) -> int: ...
    def device_name(self, index: int) -> str: ...
    def gemm_tflops(self, index: int, dtype: str, shape: tuple[int, int, int], iters: int) -> float:
        """Burst rate of one GPU: the median of the 5 fastest of `iters` timed products."""
        ...

    def gemm_sustained_tflops(self, indices: list[int], dtype: str, shape: tuple[int, int, int],
                              seconds: float, settle_seconds: float) -> dict[int, float | Exception]:
        """Sustained rate per GPU, all `indices` at once for `seconds` after `settle_seconds`
        of unmeasured work; an exception in place of the rate of a GPU whose run failed."""
        ...

    def p2p_gbytes_per_s(self, dst: int, src: int, nbytes: int, iters: int) -> float: ...
    def h2d_gbytes_per_s(self, index: int, nbytes: int, iters: int) -> float: ...
    def d2h_gbytes_per_s(self, index: int, nbytes: int, iters: int) -> float: ...
    def d2d_gbytes_per_s(self, index: int, nbytes: int, iters: int) -> float: ...


class TorchGpuMeasurer:
    """Measures with torch.cuda; reports why not when PyTorch or CUDA is missing."""

    def __init__(self) -> None:
        self.unavailable_reason = ""
        self.software_missing = False
        # The torch module, or None without PyTorch. Any: mypy skips torch (pyproject.toml), and the
        # measuring methods run only where unavailable_reason is empty, so torch is there.
        self.torch: Any
        try:
            import torch
        except ImportError:
            self.torch = None
            self.software_missing = True
            self.unavailable_reason = "PyTorch is not installed"
            return
        self.torch = torch
        if not torch.cuda.is_available():
            self.unavailable_reason = f"CUDA is not available to PyTorch {torch.__version__} (no GPU or no driver)"

    def device_count(self) -> int:
        if self.torch is None or self.unavailable_reason:
            return 0
        return self.torch.cuda.device_count()

    def device_name(self, index: int) -> str:
        return self.torch.cuda.get_device_name(index)

    def _elapsed_s(self, index: int, step, iters: int, warmup: int = 3) -> float:
        torch = self.torch
        with torch.cuda.device(index):
            for _ in range(warmup):
                step()
            torch.cuda.synchronize(index)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                step()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0

    def _release(self) -> None:
        self.torch.cuda.empty_cache()

    def _gemm_operands(self, index: int, dtype: str, shape: tuple[int, int, int]):
        torch = self.torch
        m, n, k = shape
        kind = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        device = torch.device("cuda", index)
        a = torch.randn(m, k, device=device, dtype=kind)
        b = torch.randn(k, n, device=device, dtype=kind)
        return a, b, torch.empty(m, n, device=device, dtype=kind)

    def _gemm_fastest_seconds(self, index: int, dtype: str, shape: tuple[int, int, int], iters: int) -> float:
        torch = self.torch
        a, b, c = self._gemm_operands(index, dtype, shape)
        with torch.cuda.device(index):
            for _ in range(max(3, iters // 5)):
                torch.matmul(a, b, out=c)
            torch.cuda.synchronize(index)
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
            marks[0].record()
            for i in range(iters):
                torch.matmul(a, b, out=c)
                marks[i + 1].record()
            marks[-1].synchronize()
            times = sorted(marks[i].elapsed_time(marks[i + 1]) / 1000.0 for i in range(iters))
        return statistics.median(times[:5])

    def gemm_tflops(self, index: int, dtype: str, shape: tuple[int, int, int], iters: int) -> float:
        try:
            seconds = self._gemm_fastest_seconds(index, dtype, shape, iters)
        finally:
            self._release()  # the buffers went out of scope with the helper's frame
        m, n, k = shape
        return 2 * m * n * k / seconds / 1e12

    def _sustained_one(self, index: int, dtype: str, shape: tuple[int, int, int], seconds: float,
                       settle_seconds: float, start: threading.Barrier) -> float:
        torch = self.torch
        a, b, c = self._gemm_operands(index, dtype, shape)
        flops = 2 * shape[0] * shape[1] * shape[2]
        with torch.cuda.device(index):
            torch.matmul(a, b, out=c)
            torch.cuda.synchronize(index)
            begin = time.perf_counter()
            torch.matmul(a, b, out=c)
            torch.cuda.synchronize(index)
            # Chunks of about 50 ms, synchronised between chunks so the queue never runs far ahead.
            chunk = max(1, int(0.05 / max(time.perf_counter() - begin, 1e-6)))
            start.wait()
            settle_end = time.perf_counter() + settle_seconds
            while time.perf_counter() < settle_end:
                for _ in range(chunk):
                    torch.matmul(a, b, out=c)
                torch.cuda.synchronize(index)
            first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            first.record()
            done, end = 0, time.perf_counter() + seconds
            while time.perf_counter() < end:
                for _ in range(chunk):
                    torch.matmul(a, b, out=c)
                done += chunk
                torch.cuda.synchronize(index)
            last.record()
            last.synchronize()
            return flops * done / (first.elapsed_time(last) / 1000.0) / 1e12

    def gemm_sustained_tflops(self, indices: list[int], dtype: str, shape: tuple[int, int, int],
                              seconds: float, settle_seconds: float) -> dict[int, float | Exception]:
        rates: dict[int, float | Exception] = {}
        start = threading.Barrier(len(indices))

        def run(index: int) -> None:
            try:
                rates[index] = self._sustained_one(index, dtype, shape, seconds, settle_seconds, start)
            except Exception as exc:  # noqa: BLE001 - a failing GPU is that GPU's finding
                rates[index] = exc
                start.abort()

        threads = [threading.Thread(target=run, args=(i,), name=f"gemm-gpu{i}") for i in indices]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._release()
        return rates

    def _p2p_seconds(self, dst: int, src: int, nbytes: int, iters: int) -> float:
        torch = self.torch
        source = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", src))
        target = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", dst))
        return self._elapsed_s(dst, lambda: target.copy_(source, non_blocking=True), iters)

    def p2p_gbytes_per_s(self, dst: int, src: int, nbytes: int, iters: int) -> float:
        try:
            seconds = self._p2p_seconds(dst, src, nbytes, iters)
        finally:
            self._release()  # the buffers went out of scope with the helper's frame
        return nbytes * iters / seconds / 1e9

    def _copy_seconds(self, index: int, nbytes: int, iters: int, direction: str) -> float:
        torch = self.torch
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        host.fill_(1)  # first touch happens here, on the caller's (GPU-local) CPUs
        gpu = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", index))
        if direction == "h2d":
            return self._elapsed_s(index, lambda: gpu.copy_(host, non_blocking=True), iters)
        if direction == "d2h":
            return self._elapsed_s(index, lambda: host.copy_(gpu, non_blocking=True), iters)
        twin = torch.empty_like(gpu)
        return self._elapsed_s(index, lambda: twin.copy_(gpu), iters)

    def _copy_rate(self, index: int, nbytes: int, iters: int, direction: str) -> float:
        try:
            seconds = self._copy_seconds(index, nbytes, iters, direction)
        finally:
            self._release()
        moved = 2 * nbytes if direction == "d2d" else nbytes  # d2d: read + write, as bandwidthTest counts
        return moved * iters / seconds / 1e9

    def h2d_gbytes_per_s(self, index: int, nbytes: int, iters: int) -> float:
        return self._copy_rate(index, nbytes, iters, "h2d")

    def d2h_gbytes_per_s(self, index: int, nbytes: int, iters: int) -> float:
        return self._copy_rate(index, nbytes, iters, "d2h")

    def d2d_gbytes_per_s(self, index: int, nbytes: int, iters: int) -> float:
        return self._copy_rate(index, nbytes, iters, "d2d")
