"""How long the offline plan takes: an environment stack with 10 GPU clusters on a private
network, first evaluation in a fresh process (what `python -m amlhpc.infra plan` waits for).

`python -m amlhpc.infra.plan.bench [--clusters 10] [--runs 5] [--baseline-ref REV]` writes a
throwaway stack file and evaluates it in fresh processes, the variants interleaved so that
other work on the machine slows them alike, and prints the median wall and CPU seconds of
importing amlhpc.infra.plan, the first evaluation and a second one in the same process, for:

- this tree;
- this tree with pulumi_azure_native loaded as the stock package
  (AMLHPC_PLAN_EAGER_IMPORTS=1): what amlhpc/infra/plan/lazy_provider.py saves, in the same run;
- with --baseline-ref REV, the code at git revision REV (extracted as `plan --diff-ref`
  does), e.g. the commit before a change.

Target: the first evaluation under 2 s. CPU seconds (all threads of the process) move
much less than wall seconds when the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from amlhpc.infra.config import REPO_ROOT

SIZES = ["Standard_ND96asr_v4", "Standard_ND96isr_H100_v5", "Standard_ND96amsr_A100_v4",
         "Standard_ND40rs_v2", "Standard_NC24ads_A100_v4"]
TARGET_S = 2.0
PHASES = ("import", "first", "second")

# Runs in a fresh interpreter with cwd and PYTHONPATH at the code under test; needs only
# `amlhpc.infra.plan.evaluate(stack, root)`, so older revisions can be measured too.
PROBE = """
import json, sys, time
from pathlib import Path
clock = lambda: (time.perf_counter(), time.process_time())
t0 = clock()
from amlhpc.infra.plan import evaluate
t1 = clock()
plan = evaluate(sys.argv[2], Path(sys.argv[1]))
t2 = clock()
evaluate(sys.argv[2], Path(sys.argv[1]))
t3 = clock()
span = lambda a, b: [b[0] - a[0], b[1] - a[1]]
print(json.dumps({"import": span(t0, t1), "first": span(t1, t2), "second": span(t2, t3),
                  "resources": len(plan.resources), "custom": len([r for r in plan.resources if r.custom])}))
"""


def write_stack(root: Path, clusters: int) -> str:
    config = {
        "azure-native:location": "eastus",
        "aml-hpc:owner": "bench@example.com",
        "aml-hpc:network": {"isolation": "private", "addressSpace": "10.50.0.0/16",
                            "wayIn": {"handOff": {"via": "VPN", "addressPrefixes": ["172.16.0.0/12"]}}},
        "aml-hpc:clusters": [
            {"name": f"gpu{i:02d}-bench", "sku": SIZES[i % len(SIZES)],
             "maxNodes": 1 if SIZES[i % len(SIZES)] == "Standard_NC24ads_A100_v4" else 4,
             "priority": "LowPriority" if i % 2 else "Dedicated"}
            for i in range(clusters)
        ],
        "aml-hpc:budget": {"monthlyAmountUsd": 10000, "alertEmails": ["bench@example.com"]},
    }
    (root / "Pulumi.bench.yaml").write_text(yaml.safe_dump({"config": config}))
    return "bench"


@dataclass
class Variant:
    label: str
    code: Path
    env: dict[str, str] = field(default_factory=dict)
    runs: list[dict] = field(default_factory=list)

    def measure(self, stacks: Path, stack: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(self.code), **self.env}
        proc = subprocess.run([sys.executable, "-c", PROBE, str(stacks), stack], cwd=self.code, env=env,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"{self.label}: the probe failed:\n{proc.stderr[-3000:]}")
        self.runs.append(json.loads(proc.stdout))

    def median(self, phase: str, which: int) -> float:
        return statistics.median(run[phase][which] for run in self.runs)


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def report(variants: list[Variant], runs: int, load_before: str, load_after: str) -> str:
    first = variants[0].runs[0]
    lines = [f"offline plan, {first['custom']} Azure resources ({first['resources']} with components), "
             "private network",
             f"{runs} fresh processes per variant, interleaved; medians, wall / CPU seconds",
             f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
             f"{platform.python_version()}; load average before {load_before}, after {load_after}",
             "",
             f"{'variant':40} {'import':>12} {'first eval':>12} {'second eval':>12}"]
    for v in variants:
        cells = [f"{v.median(p, 0):.2f} / {v.median(p, 1):.2f}" for p in PHASES]
        lines.append(f"{v.label:40} " + " ".join(f"{c:>12}" for c in cells))
    lines.append("")
    for v in variants:
        walls = [r["first"][0] for r in v.runs]
        lines.append(f"{v.label}: first evaluation runs (wall s) {', '.join(f'{w:.2f}' for w in walls)}; "
                     f"best {min(walls):.2f}")
    this = variants[0]
    wall = this.median("first", 0)
    lines.append(f"first evaluation of this tree: median {wall:.2f} s wall ({this.median('first', 1):.2f} s CPU), "
                 f"target < {TARGET_S:g} s: {'met' if wall < TARGET_S else 'MISSED'}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clusters", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per variant")
    parser.add_argument("--baseline-ref", metavar="REV", help="also measure the code at git revision REV")
    args = parser.parse_args()

    from amlhpc.infra.plan.lazy_provider import EAGER_ENV

    with tempfile.TemporaryDirectory(prefix="aml-hpc-bench-") as tmp:
        stacks = Path(tmp) / "stacks"
        stacks.mkdir()
        stack = write_stack(stacks, args.clusters)
        variants = [Variant("this tree", REPO_ROOT),
                    Variant("this tree, stock azure-native", REPO_ROOT, {EAGER_ENV: "1"})]
        if args.baseline_ref:
            from amlhpc.infra.plan.revision import extract, resolve

            commit = resolve(args.baseline_ref)
            baseline = Path(tmp) / "baseline"
            baseline.mkdir()
            extract(commit, baseline)
            label = commit[:7] if commit.startswith(args.baseline_ref) else f"{args.baseline_ref} ({commit[:7]})"
            variants.append(Variant(f"baseline {label}", baseline))
        load_before = _load()
        for _ in range(args.runs):
            for variant in variants:
                variant.measure(stacks, stack)
        print(report(variants, args.runs, load_before, _load()))


if __name__ == "__main__":
    main()
