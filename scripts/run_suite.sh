#!/usr/bin/env bash
# `make test` after the bootstrap: the type check and the whole suite.
#   1. mypy beside the parallel part: one process of mostly single-threaded CPU, started with
#      the workers instead of before them (on 2 CPUs it cost 30 s of wall time up front);
#   2. the parallel part: TEST_WORKERS pytest-xdist workers, a file per worker, longest first;
#   3. the `alone` tests, which measure their own CPU cost, with no neighbour.
# Every part runs; the exit status is the first failure's (mypy's, then the parallel part's,
# then the alone part's), so a type error fails `make test` as it did when mypy ran first.
# Usage: scripts/run_suite.sh [pytest args for both parts...]   (TEST_WORKERS, default 3;
#        SUITE_PYTHON, default .venv/bin/python)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${SUITE_PYTHON:-.venv/bin/python}
workers=${TEST_WORKERS:-3}
[[ $workers =~ ^[1-9][0-9]*$ ]] || { echo "TEST_WORKERS must be a whole number of workers, 1 or more (got '$workers')" >&2; exit 2; }

# Bytecode written once and read by every later process: the rehearsals start hundreds of
# interpreters, each of which otherwise compiles the modules no earlier one could cache
# (scripts/warm_bytecode.py covers the common imports, not the snapshot each simulated node
# runs from, nor pytest's rewritten test modules). PYTHONDONTWRITEBYTECODE is often set on CI.
unset PYTHONDONTWRITEBYTECODE

typed_log=$(mktemp)
trap 'rm -f "$typed_log"' EXIT
"$PY" -m mypy >"$typed_log" 2>&1 &
mypy_pid=$!

"$PY" -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder -m "not alone" "$@"
parallel=$?

wait "$mypy_pid"
typed=$?
echo "--- mypy (run beside the parallel part) ---"
cat "$typed_log"

# Only the files that mark a test `alone` are collected (the whole suite's collection costs 8 s).
mapfile -t alone_files < <(grep -rlE "mark\.alone" tests --include='test_*.py' | sort)
"$PY" -m pytest -m alone "${alone_files[@]}" "$@"
alone=$?

for status in "$typed" "$parallel" "$alone"; do
  (( status == 0 )) || exit "$status"
done
