#!/usr/bin/env bash
# Installs everything `make test` and `make demo` need on a fresh clone, idempotently:
#   uv (from PyPI, into .bootstrap/, when not on PATH) -> the locked environment in .venv
#   -> PyTorch (CPU build where this machine offers a local wheel, the normal build
#   elsewhere) -> Azurite (npm, pinned by package-lock.json).
# Usage: scripts/bootstrap.sh [--no-node]
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION="0.13.8"
want_node=1
[[ "${1:-}" == "--no-node" ]] && want_node=0

log() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*" >&2; }

# 1. uv
if command -v uv >/dev/null 2>&1; then
  UV=$(command -v uv)
else
  UV=.bootstrap/bin/uv
  if [[ ! -x $UV ]]; then
    log "installing uv $UV_VERSION from PyPI into .bootstrap/"
    python3 -m pip install --quiet --disable-pip-version-check --target .bootstrap "uv==$UV_VERSION"
  fi
fi

# 2. the locked environment. --inexact keeps PyTorch, which the lock deliberately leaves out.
stamp=.venv/.aml-hpc-synced
if [[ ! -f $stamp || uv.lock -nt $stamp || pyproject.toml -nt $stamp ]]; then
  log "syncing .venv from uv.lock"
  # Precompiled bytecode: this machine (and CI) may set PYTHONDONTWRITEBYTECODE, and the
  # Azure SDKs are large enough that compiling them on every import costs seconds.
  "$UV" sync --frozen --inexact --compile-bytecode
  touch "$stamp"
fi

# 3. PyTorch: kept out of the lock (job images bring their own; the registry build pulls
# several GB of CUDA packages). Prefer a CPU wheel this machine's pip configuration points
# at (find-links); otherwise install the normal build for this platform.
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
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
    "$UV" pip install --compile-bytecode --python .venv/bin/python --find-links "$(dirname "$wheel")" "torch==$version" numpy
  else
    log "installing PyTorch from PyPI (set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu for the CPU build)"
    "$UV" pip install --compile-bytecode --python .venv/bin/python ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL" --extra-index-url https://pypi.org/simple} torch numpy
  fi
fi

# 4. Azurite, the Blob emulator the tests and the rehearsal run against.
if (( want_node )) && [[ ! -x node_modules/.bin/azurite-blob || package-lock.json -nt node_modules/.bin/azurite-blob ]]; then
  command -v npm >/dev/null 2>&1 || { log "npm not found: install Node.js 20+ (https://nodejs.org) for Azurite"; exit 1; }
  log "installing Azurite from npm (package-lock.json)"
  npm ci --no-audit --no-fund --loglevel=error
  touch node_modules/.bin/azurite-blob
fi
log "ready"
