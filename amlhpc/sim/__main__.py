"""`python -m amlhpc.sim`: run the simulation's scenarios.

    python -m amlhpc.sim list                                  # the scenarios
    python -m amlhpc.sim explore SCENARIO --seed N             # one run: its faults, violations and trace
    python -m amlhpc.sim explore SCENARIO --seeds 0-999        # a sweep: the seeds that broke an invariant

Exit status: 0 when every run kept its invariants, 1 when one did not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence


def _seeds(text: str) -> range:
    first, _, last = text.partition("-")
    try:
        start = int(first)
        end = int(last) if last else start
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: give A-B (e.g. 0-199) or one number") from None
    if end < start:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: the range is empty")
    return range(start, end + 1)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m amlhpc.sim", description="A simulated Azure that runs the "
                                     "project's coordination code under seeded interleavings and faults.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the scenarios and what each runs")
    explore = commands.add_parser("explore", help="run a scenario under one seed (with its trace) or a range of seeds")
    explore.add_argument("scenario")
    which = explore.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="one run; prints its fault plan, violations and trace")
    which.add_argument("--seeds", type=_seeds, help="a sweep A-B; prints the seeds that broke an invariant")
    explore.add_argument("--nodes", type=int, default=None, help="the scenario's size (default: drawn from the seed)")
    explore.add_argument("--no-trace", action="store_true", help="with --seed: leave the trace out")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from amlhpc.sim.explore import run, scenarios

    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) and 2
    known = scenarios()
    if args.command == "list":
        for name, kind in sorted(known.items()):
            print(f"{name:<22} {kind.summary}")
        return 0
    if args.scenario not in known:
        print(f"python -m amlhpc.sim: no scenario {args.scenario!r}; the scenarios are: {', '.join(sorted(known))} "
              "(`python -m amlhpc.sim list`)", file=sys.stderr)
        return 2
    if args.nodes is not None and args.nodes < 1:
        print(f"python -m amlhpc.sim: --nodes {args.nodes}: give a positive number of nodes", file=sys.stderr)
        return 2
    if args.seed is not None:
        outcome = run(args.scenario, args.seed, size=args.nodes, keep_trace=not args.no_trace)
        print(outcome.report(trace=not args.no_trace))
        return 0 if outcome.ok else 1
    started, kinds, failed = time.perf_counter(), Counter[str](), []
    for seed in args.seeds:
        outcome = run(args.scenario, seed, size=args.nodes, keep_trace=False)
        if not outcome.ok:
            failed.append(seed)
            kinds.update(outcome.kinds())
            print(f"seed {seed}: " + "; ".join(str(v) for v in outcome.violations))
    print(f"{args.scenario}: {len(args.seeds)} seed(s), {len(failed)} broke an invariant"
          + (f" ({', '.join(f'{k} x{n}' for k, n in sorted(kinds.items()))})" if kinds else "")
          + f" in {time.perf_counter() - started:.1f}s; replay one with: python -m amlhpc.sim explore "
            f"{args.scenario} --seed N")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
