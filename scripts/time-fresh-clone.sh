#!/usr/bin/env bash
# How long a newcomer waits on a fresh clone of this repository (HEAD, or --rev REV):
#   1. the first `make demo` (its install step, then the demo; the demo prints its own time);
#   2. the install step of `make test`, which is `make bootstrap`, in another fresh clone.
# Each clone starts with no .venv and no node_modules; uv's and npm's download caches are
# this machine's (normally warm; the report gives their size). Wall and CPU seconds per
# step, the load average around them and the machine go into REPORT (markdown). Timing an
# older revision (e.g. before a change) with --rev gives the baseline for the same machine.
# Usage: scripts/time-fresh-clone.sh [--rev REV] [REPORT.md]   (default bench/out/bootstrap.md)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
rev=HEAD
if [[ ${1:-} == --rev ]]; then rev=$2; shift 2; fi
report=${1:-bench/out/bootstrap.md}
mkdir -p "$(dirname "$report")"
commit=$(git rev-parse --short "$rev")
work=$(mktemp -d "${TMPDIR:-/tmp}/aml-hpc-fresh-XXXXXX")
trap 'rm -rf "$work"' EXIT

rows=()
# step NAME DIR COMMAND...: run it, record wall and CPU (user+sys of it and its children)
step() {
  local name=$1 dir=$2; shift 2
  local load_before start end wall cpu
  load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
  start=$(date +%s.%N)
  # shellcheck disable=SC2016  # the inner script's own arguments
  /usr/bin/time -f "%U %S" -o "$work/cpu" bash -c 'cd "$1"; shift; "$@"' _ "$dir" "$@" >"$work/$name.log" 2>&1 \
    || { echo "step '$name' failed; its log:" >&2; tail -n 40 "$work/$name.log" >&2; exit 1; }
  end=$(date +%s.%N)
  wall=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.0f", b - a}')
  cpu=$(awk '{printf "%.0f", $1 + $2}' "$work/cpu")
  rows+=("| $commit | $name | $wall | $cpu | $load_before / $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?") |")
  printf '%-28s %5s s wall %5s s CPU\n' "$name" "$wall" "$cpu" >&2
}

clone() { git clone --quiet "$repo" "$1" && git -C "$1" checkout --quiet "$commit"; }
clone "$work/demo"
clone "$work/test"
step "first make demo" "$work/demo" make demo
demo_s=$(grep -o 'demo finished in [0-9]* s' "$work/first make demo.log" | grep -o '[0-9]*' || echo "?")
step "make test: install step" "$work/test" make bootstrap

uv=$(command -v uv || echo "$work/test/.bootstrap/bin/uv")
{
  echo "| commit | step | wall s | CPU s | load average before / after |"
  echo "|---|---|---:|---:|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "The demo itself, as it reports: ${demo_s} s of the first \`make demo\`; the rest is installing."
  echo "$(date -u +%Y-%m-%dT%H:%MZ); $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo);" \
       "uv $("$uv" --version | cut -d' ' -f2), npm $(npm --version); download caches before the run:" \
       "uv $(du -sh "$("$uv" cache dir)" | cut -f1), npm $(du -sh ~/.npm/_cacache 2>/dev/null | cut -f1 || echo none)."
  if [[ $rev == HEAD ]]; then echo "Command: scripts/time-fresh-clone.sh (make bench-bootstrap)."; else echo "Command: scripts/time-fresh-clone.sh --rev $rev."; fi
} >"$report"
cat "$report"
