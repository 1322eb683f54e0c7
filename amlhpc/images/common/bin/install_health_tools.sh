#!/usr/bin/env bash
# Builds the tools the node health gate runs (amlhpc/jobs/runtime/health) into /opt/aml-hpc/tools,
# the way Azure builds them for its own node health checks (Azure/azurehpc-health-checks
# dockerfile/azure-nvrt-nhc.dockerfile and azure-rocm-nhc.dockerfile; Azure/azhpc-images
# components/install_nccl.sh, install_rccl.sh, install_nvbandwidth_tool.sh, install_dcgm.sh):
#
#   NVIDIA  perftest with CUDA (ib_write_bw --use_cuda: GPUDirect RDMA; the distributions'
#           perftest lacks it), nccl-tests (all_reduce_perf, MPI=1 on the base's HPC-X),
#           nvbandwidth, DCGM (dcgmi, and ubergemm for the GEMM check) from NVIDIA's CUDA repository
#   AMD     perftest with ROCm (--use_rocm), rccl-tests (all_reduce_perf for RCCL, MPI=1) from
#           ROCm/rocm-systems projects/rccl-tests (AMD moved it there from ROCm/rccl-tests in 2026)
#   both    numactl (the InfiniBand test binds to the HCA's NUMA node, as Azure's check does)
#
# Every input is a build arg from amlhpc/images/pins.toml. Sources are cloned at the pinned commit and
# the build stops unless HEAD is exactly that commit; the CUDA repository's key is trusted only
# when it is the pinned one. Runs in a Dockerfile RUN step.
set -euo pipefail

vendor="${GPU_VENDOR:?GPU_VENDOR must be nvidia or amd}"
prefix=/opt/aml-hpc/tools
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

log() { printf '[aml-hpc tools] %s\n' "$*"; }
die() { printf '[aml-hpc tools] error: %s\n' "$*" >&2; exit 1; }

# clone_at URL COMMIT DIR [SUBDIR]: the repository at exactly COMMIT, or stop; with SUBDIR only that
# folder is checked out (a sparse checkout of a monorepo such as ROCm/rocm-systems).
clone_at() {
  if [[ -n "${4:-}" ]]; then
    git clone --quiet --filter=blob:none --no-checkout "$1" "$3"
    git -C "$3" sparse-checkout set "$4"
  else
    git clone --quiet --filter=blob:none "$1" "$3"
  fi
  git -C "$3" -c advice.detachedHead=false checkout --quiet "$2"
  [[ "$(git -C "$3" rev-parse HEAD)" == "$2" ]] || die "$1 is not at the pinned commit $2"
}

# find_mpi: the MPI installation to build the all-reduce tests against (MPI_HOME, else the first
# Open MPI found), with mpirun linked onto PATH for the health gate.
find_mpi() {
  local home="${MPI_HOME:-}" candidate
  if [[ -z "$home" ]]; then
    for candidate in /opt/hpcx/ompi /opt/ompi /usr/mpi/gcc/openmpi-* /usr/lib/x86_64-linux-gnu/openmpi /usr; do
      if [[ -x "$candidate/bin/mpicc" && -x "$candidate/bin/mpirun" ]]; then home="$candidate"; break; fi
    done
  fi
  [[ -n "$home" && -x "$home/bin/mpirun" ]] || die "no MPI installation (mpicc, mpirun) found: set MPI_HOME"
  command -v mpirun >/dev/null || ln -sf "$home/bin/mpirun" /usr/local/bin/mpirun
  echo "$home"
}

build_perftest() {
  : "${PERFTEST_VERSION:?}" "${PERFTEST_COMMIT:?}"
  log "perftest ${PERFTEST_VERSION} (${PERFTEST_COMMIT}) with ${vendor} GPU memory"
  clone_at https://github.com/linux-rdma/perftest.git "${PERFTEST_COMMIT}" "$work/perftest"
  local gpu=()
  if [[ "$vendor" == nvidia ]]; then
    gpu=("CUDA_H_PATH=${CUDA_HOME:-/usr/local/cuda}/include/cuda.h")
  else
    gpu=(--enable-rocm --with-rocm=/opt/rocm)
  fi
  (cd "$work/perftest" && ./autogen.sh >/dev/null && ./configure --prefix="$prefix" "${gpu[@]}" >/dev/null \
    && make -j"$(nproc)" >/dev/null && make install >/dev/null)
  "$prefix/bin/ib_write_bw" --help 2>&1 | grep -q -- "--use_$([[ "$vendor" == nvidia ]] && echo cuda || echo rocm)" \
    || die "ib_write_bw was built without ${vendor} GPU memory support"
}

build_nccl_tests() {
  : "${NCCL_TESTS_VERSION:?}" "${NCCL_TESTS_COMMIT:?}"
  log "nccl-tests ${NCCL_TESTS_VERSION} (${NCCL_TESTS_COMMIT}), MPI=1"
  clone_at https://github.com/NVIDIA/nccl-tests.git "${NCCL_TESTS_COMMIT}" "$work/nccl-tests"
  make -C "$work/nccl-tests" -j"$(nproc)" MPI=1 MPI_HOME="${MPI_HOME:-/opt/hpcx/ompi}" \
    CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" >/dev/null
  install -m 0755 "$work"/nccl-tests/build/*_perf "$prefix/bin/"
}

build_rccl_tests() {
  : "${RCCL_TESTS_REPO:?}" "${RCCL_TESTS_PATH:?}" "${RCCL_TESTS_COMMIT:?}"
  local mpi
  mpi="$(find_mpi)"
  log "rccl-tests (${RCCL_TESTS_REPO} ${RCCL_TESTS_PATH} at ${RCCL_TESTS_COMMIT}), MPI=1 on ${mpi}"
  clone_at "${RCCL_TESTS_REPO}" "${RCCL_TESTS_COMMIT}" "$work/rocm-systems" "${RCCL_TESTS_PATH}"
  make -C "$work/rocm-systems/${RCCL_TESTS_PATH}" -j"$(nproc)" MPI=1 MPI_HOME="$mpi" HIP_HOME=/opt/rocm \
    NCCL_HOME=/opt/rocm >/dev/null
  install -m 0755 "$work/rocm-systems/${RCCL_TESTS_PATH}"/build/*_perf "$prefix/bin/"
}

install_numactl() {
  command -v numactl >/dev/null && return
  log "numactl (Ubuntu package)"
  apt-get update >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends numactl >/dev/null
}

build_nvbandwidth() {
  : "${NVBANDWIDTH_VERSION:?}" "${NVBANDWIDTH_COMMIT:?}"
  log "nvbandwidth ${NVBANDWIDTH_VERSION} (${NVBANDWIDTH_COMMIT})"
  clone_at https://github.com/NVIDIA/nvbandwidth.git "${NVBANDWIDTH_COMMIT}" "$work/nvbandwidth"
  (cd "$work/nvbandwidth" && cmake -DCMAKE_CUDA_COMPILER="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" . >/dev/null \
    && make -j"$(nproc)" >/dev/null)
  install -m 0755 "$work/nvbandwidth/nvbandwidth" "$prefix/bin/"
}

install_dcgm() {
  : "${DCGM_VERSION:?}" "${CUDA_REPO_KEY:?}"
  local cuda_major repo_arch
  cuda_major="$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
  [[ -n "$cuda_major" ]] || die "cannot tell the CUDA major version (nvcc --version)"
  repo_arch="$([[ "$(uname -m)" == aarch64 ]] && echo sbsa || echo x86_64)"
  . /etc/os-release
  local repo="https://developer.download.nvidia.com/compute/cuda/repos/${ID}${VERSION_ID/./}/${repo_arch}"
  log "DCGM ${DCGM_VERSION} for CUDA ${cuda_major} from ${repo}"
  install -d -m 0755 /etc/apt/keyrings
  curl -fsSL --retry 3 "${repo}/3bf863cc.pub" -o /etc/apt/keyrings/cuda-aml-hpc.asc
  "$here/verify_signing_key.sh" /etc/apt/keyrings/cuda-aml-hpc.asc "${CUDA_REPO_KEY}"
  echo "deb [signed-by=/etc/apt/keyrings/cuda-aml-hpc.asc] ${repo}/ /" > /etc/apt/sources.list.d/cuda-aml-hpc.list
  apt-get update
  # The proprietary CUDA plugins carry ubergemm, the GEMM workload Azure's GEMM marks were measured
  # with (as Azure/azhpc-images install_dcgm.sh installs them); from DCGM 4.7 it is its own package.
  local packages=("datacenter-gpu-manager-4-core=${DCGM_VERSION}" "datacenter-gpu-manager-4-cuda${cuda_major}=${DCGM_VERSION}"
                  "datacenter-gpu-manager-4-proprietary=${DCGM_VERSION}"
                  "datacenter-gpu-manager-4-proprietary-cuda${cuda_major}=${DCGM_VERSION}")
  if apt-cache show "datacenter-gpu-manager-4-cuda${cuda_major}-ubergemm2=${DCGM_VERSION}" >/dev/null 2>&1; then
    packages+=("datacenter-gpu-manager-4-cuda${cuda_major}-ubergemm2=${DCGM_VERSION}")
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}"
  rm -f /etc/apt/sources.list.d/cuda-aml-hpc.list
  # Azure's scripts run the "updated" build; link it onto PATH for the health gate and the smoke check.
  local plugins="/usr/libexec/datacenter-gpu-manager-4/plugins/cuda${cuda_major}" ubergemm
  for ubergemm in "$plugins/updated/ubergemm" "$plugins/ubergemm" ""; do
    [[ -x "$ubergemm" ]] && break
  done
  [[ -n "$ubergemm" ]] || die "DCGM ${DCGM_VERSION} installed no ubergemm under $plugins (the health gate's GEMM tool)"
  ln -sf "$ubergemm" "$prefix/bin/ubergemm"
}

install -d -m 0755 "$prefix/bin"
case "$vendor" in
  nvidia) install_numactl; build_perftest; build_nccl_tests; build_nvbandwidth; install_dcgm ;;
  amd) install_numactl; build_perftest; build_rccl_tests ;;
  *) die "GPU_VENDOR=${vendor} is not nvidia or amd" ;;
esac
for tool in "$prefix"/bin/*; do
  ln -sf "$tool" "/usr/local/bin/$(basename "$tool")"
done
apt-get clean
rm -rf /var/lib/apt/lists/*
log "installed: $(ls "$prefix/bin" | tr '\n' ' ')"
