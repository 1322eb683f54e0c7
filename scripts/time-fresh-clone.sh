#!/usr/bin/env bash
# How long a newcomer waits on a fresh clone of this repository's HEAD:
#   1. the first `make demo`: its install step (scripts/bootstrap.sh --for demo), then the demo;
#   2. the install step of `make test` (scripts/bootstrap.sh --for test), in another fresh clone.
# Each clone starts with no .venv and no node_modules; uv's and npm's download caches are
# whatever this machine has (normally warm: the report says so, it cannot tell). Wall and
# CPU seconds per step, the load average around them, and the machine go into REPORT.
# Usage: scripts/time-fresh-clone.sh [REPORT.md]   (default bench/out/bootstrap.md)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
report=${1:-bench/out/bootstrap.md}
mkdir -p "$(dirname "$report")"
work=$(mktemp -d "${TMPDIR:-/tmp}/aml-hpc-fresh-XXXXXX")
trap 'rm -rf "$work"' EXIT

rows=()
# step NAME DIR COMMAND...: run it, record wall and CPU (user+sys of it and its children)
step() {
  local name=$1 dir=$2; shift 2
  local load_before start end
  load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
  start=$(date +%s.%N)
  # shellcheck disable=SC2016  # the inner script's own arguments
  /usr/bin/time -f "%U %S" -o "$work/cpu" bash -c 'cd "$1"; shift; "$@"' _ "$dir" "$@" >"$work/$name.log" 2>&1 \
    || { echo "step '$name' failed; its log:" >&2; tail -n 40 "$work/$name.log" >&2; exit 1; }
  end=$(date +%s.%N)
  local wall cpu
  wall=$(awk -v a="$start" -v b="$end" 'BEGIN {print b - a}')
  cpu=$(awk '{printf "%.0f", $1 + $2}' "$work/cpu")
  rows+=("| $name | $(printf '%.0f' "$wall") | $cpu | $load_before / $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?") |")
  printf '%-32s %6.0f s wall %6s s CPU\n' "$name" "$wall" "$cpu" >&2
}

git clone --quiet "$repo" "$work/demo"
git clone --quiet "$repo" "$work/test"
step "make demo: install step" "$work/demo" scripts/bootstrap.sh --for demo
step "make demo: the demo" "$work/demo" .venv/bin/python -m jobs.local.demo
step "make test: install step" "$work/test" scripts/bootstrap.sh --for test

{
  echo "| step | wall s | CPU s | load average before / after |"
  echo "|---|---:|---:|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ); $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo);"
  uv=$(command -v uv || echo "$work/test/.bootstrap/bin/uv")
  echo "uv $("$uv" --version | cut -d' ' -f2), npm $(npm --version); download caches: uv $(du -sh "$("$uv" cache dir)" | cut -f1),"
  echo "npm $(du -sh ~/.npm/_cacache 2>/dev/null | cut -f1 || echo none) (warm: nothing was downloaded that they held)."
  echo "Command: scripts/time-fresh-clone.sh (make bench-bootstrap)."
} >"$report"
cat "$report"
