#!/usr/bin/env bash
# Installs what `make demo` or `make test` needs on a fresh clone, idempotently:
#   uv (from PyPI, into .bootstrap/, when not on PATH) -> the locked environment in .venv
#   (the project's dependencies; for tests also the dev and bert groups) -> PyTorch (CPU
#   build where this machine offers a local wheel, the normal build elsewhere) -> bytecode
#   for the modules the demo or the tests import (scripts/warm_bytecode.py) -> Azurite (npm,
#   pinned by package-lock.json), installed in the background while Python is set up.
# Usage: scripts/bootstrap.sh [--for demo|test] [--no-node]     (default: --for test)
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION="0.13.8"
want_node=1
profile="test"
while (( $# )); do
  case "$1" in
    --no-node) want_node=0 ;;
    --for) profile="${2:-}"; shift ;;
    *) echo "usage: scripts/bootstrap.sh [--for demo|test] [--no-node]" >&2; exit 2 ;;
  esac
  shift
done
[[ $profile == demo || $profile == test ]] || { echo "--for takes demo or test" >&2; exit 2; }

log() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*" >&2; }
# Each step that can take long says what it does first and how long it took after.
began=$SECONDS
took() { log "  ... done in $((SECONDS - began)) s"; began=$SECONDS; }
mkdir -p .bootstrap

# 0. Azurite, the Blob emulator the tests and the rehearsal run against: npm is mostly
# waiting on files, so it runs while the Python side uses the CPU.
npm_pid=""
if (( want_node )) && [[ ! -x node_modules/.bin/azurite-blob || package-lock.json -nt node_modules/.bin/azurite-blob ]]; then
  command -v npm >/dev/null 2>&1 || { log "npm not found: install Node.js 20+ (https://nodejs.org) for Azurite"; exit 1; }
  log "installing Azurite from npm (package-lock.json), in the background"
  npm ci --no-audit --no-fund --loglevel=error --prefer-offline >.bootstrap/npm.log 2>&1 &
  npm_pid=$!
  trap '[[ -z $npm_pid ]] || kill "$npm_pid" 2>/dev/null || true' EXIT  # a failure below stops it too
fi

# 1. uv
if command -v uv >/dev/null 2>&1; then
  UV=$(command -v uv)
else
  UV=.bootstrap/bin/uv
  if [[ ! -x $UV ]]; then
    log "installing uv $UV_VERSION from PyPI into .bootstrap/"
    python3 -m pip install --quiet --disable-pip-version-check --target .bootstrap "uv==$UV_VERSION"
    took
  fi
fi

# 2. the locked environment. --inexact keeps PyTorch, which the lock deliberately leaves out.
# No --compile-bytecode: step 4 compiles what is used (a few thousand of ~18,000 modules).
stamp=.venv/.aml-hpc-synced-$profile
if [[ ! -f $stamp || uv.lock -nt $stamp || pyproject.toml -nt $stamp ]]; then
  if [[ $profile == test ]]; then groups=(--all-groups); else groups=(--no-default-groups); fi
  log "syncing .venv from uv.lock (${profile}: ${groups[*]}; a first install downloads ~1 GB)"
  "$UV" sync --frozen --inexact --extra report "${groups[@]}"
  took
  touch "$stamp"
  [[ $profile == test ]] && touch .venv/.aml-hpc-synced-demo  # the test environment holds the demo's
fi

# 3. PyTorch: kept out of the lock (job images bring their own; the registry build pulls
# several GB of CUDA packages). Prefer a CPU wheel this machine's pip configuration points
# at (find-links); otherwise install the normal build for this platform.
if ! .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2>/dev/null; then
  links=$( { printf '%s\n' "${PIP_FIND_LINKS:-}"; python3 -m pip config get global.find-links 2>/dev/null || true; } | tr ' ' '\n' | sed 's#^file://##' | grep -v '^$' || true)
  wheel=""
  for dir in $links; do
    [[ -d $dir ]] || continue
    wheel=$(ls "$dir"/torch-*cpu*-cp3*.whl 2>/dev/null | sort -V | tail -n1 || true)
    [[ -n $wheel ]] && break
  done
  if [[ -n $wheel ]]; then
    version=$(basename "$wheel" | cut -d- -f2)
    log "installing PyTorch $version (CPU) from $(dirname "$wheel")"
    "$UV" pip install --python .venv/bin/python --find-links "$(dirname "$wheel")" "torch==$version" numpy
    took
  else
    log "installing PyTorch from PyPI (set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu for the CPU build)"
    "$UV" pip install --python .venv/bin/python ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL" --extra-index-url https://pypi.org/simple} torch numpy
    took
  fi
  rm -f .venv/.aml-hpc-bytecode-*
fi

# 4. bytecode for what is imported (PYTHONDONTWRITEBYTECODE would otherwise make every
# process compile its imports again).
warm=.venv/.aml-hpc-bytecode-$profile
if [[ ! -f $warm || $stamp -nt $warm ]]; then
  log "compiling the modules the $profile imports (a few minutes on 2 cores; each step is listed as it runs)"
  .venv/bin/python scripts/warm_bytecode.py "$profile"
  took
  touch "$warm"
  [[ $profile == test ]] && touch .venv/.aml-hpc-bytecode-demo
fi

if [[ -n $npm_pid ]]; then
  kill -0 "$npm_pid" 2>/dev/null && log "waiting for the Azurite install (npm, log in .bootstrap/npm.log)"
  if ! wait "$npm_pid"; then
    npm_pid=""
    log "npm ci failed:"; tail -n 30 .bootstrap/npm.log >&2; exit 1
  fi
  npm_pid=""
  touch node_modules/.bin/azurite-blob
fi
log "ready"
