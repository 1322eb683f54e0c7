"""How long the offline plan takes for an environment stack with 10 GPU clusters.

`python -m infra.plan.bench [--clusters 10] [--repeat 3]` writes a throwaway stack file,
evaluates it under the mock runtime and prints: import time, the first (cold) evaluation,
and the median of the repeats (warm). The target is under 5 s for the cold evaluation.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import yaml

SIZES = ["Standard_ND96asr_v4", "Standard_ND96isr_H100_v5", "Standard_ND96amsr_A100_v4",
         "Standard_ND40rs_v2", "Standard_NC24ads_A100_v4"]


def write_stack(root: Path, clusters: int) -> str:
    config = {
        "azure-native:location": "eastus",
        "aml-hpc:owner": "bench@example.com",
        "aml-hpc:network": {"isolation": "private", "addressSpace": "10.50.0.0/16"},
        "aml-hpc:clusters": [
            {"name": f"gpu-{i:02d}", "sku": SIZES[i % len(SIZES)],
             "maxNodes": 1 if SIZES[i % len(SIZES)] == "Standard_NC24ads_A100_v4" else 4,
             "priority": "LowPriority" if i % 2 else "Dedicated"}
            for i in range(clusters)
        ],
        "aml-hpc:budget": {"monthlyAmountUsd": 10000, "alertEmails": ["bench@example.com"]},
    }
    (root / "Pulumi.bench.yaml").write_text(yaml.safe_dump({"config": config}))
    return "bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clusters", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    t0 = time.perf_counter()
    from infra.plan import evaluate

    imported = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        stack = write_stack(Path(tmp), args.clusters)
        t1 = time.perf_counter()
        plan = evaluate(stack, Path(tmp))
        cold = time.perf_counter() - t1
        warm = []
        for _ in range(args.repeat):
            t2 = time.perf_counter()
            evaluate(stack, Path(tmp))
            warm.append(time.perf_counter() - t2)
    clusters = len(plan.of_type("azure-native:machinelearningservices:Compute"))
    print(f"offline plan, {clusters} clusters, {len(plan.custom_resources())} Azure resources "
          f"({len(plan.resources)} with components), private network")
    print(f"  import infra.plan:          {imported:6.2f} s")
    print(f"  first evaluation (cold):    {cold:6.2f} s   target < 5 s: {'met' if cold < 5 else 'MISSED'}")
    print(f"  median of {args.repeat} warm evaluations: {statistics.median(warm):6.2f} s")


if __name__ == "__main__":
    main()
