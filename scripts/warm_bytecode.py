"""Compile to bytecode what `make demo` (or `make test`) imports, and nothing else.

    .venv/bin/python scripts/warm_bytecode.py demo|test

Why: PYTHONDONTWRITEBYTECODE is often set (CI, this kind of machine), so without
precompiled bytecode every process compiles each module it imports, every time: `import
azure.ai.ml, torch` takes twice as long. Compiling the whole environment (what
`uv sync --compile-bytecode` does) costs minutes on 2 cores for ~18,000 files, most of
which nothing here imports (pulumi-azure-native's ~6,000 modules for every Azure service,
most of torch and sympy). This imports what the demo's (or the tests') processes import -
and runs the offline plan, a job render and a few DDP training steps, which import more as
they go - with bytecode writing switched on, so exactly those modules get their `.pyc`. A failing step is reported
and skipped: this only makes later runs faster.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.dont_write_bytecode = False  # the point of this script, whatever the environment says
REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

DEMO_MODULES = [
    # the command lines
    "amlhpc.infra.cli", "amlhpc.jobs.cli.main", "amlhpc.jobs.local.cli", "amlhpc.jobs.local.demo", "amlhpc.jobs.data.cli", "amlhpc.jobs.data.upload",
    # what runs on every simulated node
    "amlhpc.jobs.runtime.launch.launcher", "amlhpc.jobs.runtime.staging.stager", "amlhpc.jobs.runtime.checkpoint", "amlhpc.jobs.runtime.health.__main__",
    "amlhpc.jobs.runtime.health.runner", "amlhpc.jobs.runtime.node.topology", "amlhpc.jobs.runtime.blob.blobio",
    "amlhpc.jobs.workloads.cosmoflow.train", "amlhpc.jobs.workloads.cosmoflow.generate", "amlhpc.jobs.workloads.allreduce",
    "torch", "torch.distributed", "torch.nn.parallel", "torch.utils.data", "torch.profiler",
    "azure.identity", "azure.storage.blob", "azure.ai.ml", "azure.ai.ml.entities",
]
TEST_MODULES = ["pytest", "pytest_mock", "pytest_timeout", "typer.testing", "transformers",
                "transformers.models.bert.modeling_bert", "amlhpc.jobs.workloads.bert_pretrain.train", "pulumi_policy"]


def _plan_and_render() -> None:
    """The offline plan and a job rendered as YAML: they import the Azure resource and job
    entity modules they use lazily."""
    from amlhpc.jobs import recipes
    from amlhpc.jobs.plan import build, outputs

    loaded = outputs.load("dev", offline=True, root=REPO_ROOT)
    plan = build.plan_job(recipes.load("cosmoflow"), loaded.outputs, name="warm-up")
    build.to_yaml(plan, REPO_ROOT / "amlhpc" / "jobs")


def _train_steps(bert: bool = False) -> None:
    """A few DDP steps over gloo in a world of one, as the training processes take them:
    DDP, autograd, the optimizer and torch.save import far more of torch (and sympy) than
    `import torch` does."""
    import os
    import socket
    import tempfile

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from amlhpc.jobs.workloads.cosmoflow.model import CosmoFlow

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        models = [(CosmoFlow(16, 4, 4, 2, 8, 4), lambda m: m(torch.zeros(2, 4, 16, 16, 16)).float().pow(2).mean())]
        if bert:
            from transformers import BertConfig, BertForMaskedLM

            config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=16)
            ids = torch.randint(4, 64, (2, 8))
            models.append((BertForMaskedLM(config), lambda m: m(input_ids=ids, labels=ids).loss))
        for model, loss_of in models:
            ddp = DistributedDataParallel(model)
            optimizer = torch.optim.AdamW(ddp.parameters())
            for _ in range(2):
                optimizer.zero_grad()
                loss_of(ddp).backward()
                optimizer.step()
            tensor = torch.ones(4)
            dist.all_reduce(tensor)
            with tempfile.TemporaryDirectory() as tmp:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(tmp, "c.pt"))
                torch.load(os.path.join(tmp, "c.pt"), weights_only=False)
    finally:
        dist.destroy_process_group()


def _test_collection() -> None:
    """pytest's collection of the suite: it imports every test module and what they import, and
    keeps each test module's assertion-rewritten bytecode, which every worker of `make test`
    would otherwise rewrite again (about 12 s of CPU per worker on 2 cores)."""
    import contextlib
    import io

    import pytest

    with contextlib.redirect_stdout(io.StringIO()) as listing:
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", str(REPO_ROOT / "tests")])
    if code != 0:
        raise RuntimeError(f"pytest's collection exited {code}: {listing.getvalue().strip().splitlines()[-1:]}")


def run_steps(steps: list[tuple[str, Callable[[], object]]], out=sys.stderr) -> list[str]:
    """Run each step, saying which one and how long it took as it goes (the whole takes
    minutes on 2 cores: nobody should wonder whether it hangs). Returns the skipped ones."""
    skipped = []
    for i, (name, step) in enumerate(steps, 1):
        began = time.monotonic()
        print(f"  [{i}/{len(steps)}] {name}", end="", file=out, flush=True)
        try:
            step()
            print(f" ({time.monotonic() - began:.1f} s)", file=out, flush=True)
        except Exception as exc:  # an optional module missing, or a step failing: not fatal here
            skipped.append(f"{name} ({type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''})")
            print(" (skipped)", file=out, flush=True)
    return skipped


def main(profile: str) -> int:
    if profile not in ("demo", "test"):
        print("usage: warm_bytecode.py demo|test", file=sys.stderr)
        return 2
    started = time.monotonic()
    steps: list[tuple[str, Callable[[], object]]] = [(name, partial(importlib.import_module, name))
                                                     for name in DEMO_MODULES]
    steps.append(("offline plan and job YAML", _plan_and_render))
    if profile == "test":
        steps += [(name, partial(importlib.import_module, name)) for name in TEST_MODULES]
        steps.append(("the test modules, collected by pytest", _test_collection))
    steps.append(("training steps", lambda: _train_steps(bert=profile == "test")))
    skipped = run_steps(steps)
    site = next((p for p in sys.path if p.endswith("site-packages")), "")
    compiled = sum(1 for m in list(sys.modules.values()) if (getattr(m, "__file__", "") or "").startswith(site))
    print(f"bytecode for the {compiled} installed modules the {profile} imports ({time.monotonic() - started:.0f} s)"
          + (f"; skipped: {'; '.join(skipped)}" if skipped else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ""))
