#!/usr/bin/env bash
# Adds an InfiniBand user space on top of the base image, or keeps the base's own.
# Runs in a Dockerfile RUN step; every input is a build arg from amlhpc/images/pins.toml:
#   IB_USERSPACE       none | doca | mlnx-ofed
#   DOCA_VERSION       e.g. 3.2.3   DOCA_REPO        https://linux.mellanox.com/public/repo/doca
#   DOCA_KEY           the repository signing key's pinned fingerprint (or 64-bit id)
#   MLNX_OFED_VERSION  e.g. 24.10-1.1.4.0
#   MLNX_OFED_URL      https://content.mellanox.com/ofed   MLNX_OFED_SHA256  sha256 of the tarball
# User space only, never kernel modules: the host's driver serves the container, so the
# libraries here only need to match the host's driver line (see docs/images.md). Either way
# infiniband-diags (ibstat, ibstatus) is installed for the health gate: from the DOCA
# repository with DOCA, else Ubuntu's rdma-core build.
set -euo pipefail

mode="${IB_USERSPACE:?IB_USERSPACE must be set (none, doca or mlnx-ofed; amlhpc/images/pins.toml [infiniband].userspace)}"

log() { printf '[aml-hpc ib] %s\n' "$*"; }
die() { printf '[aml-hpc ib] error: %s\n' "$*" >&2; exit 1; }

os_id() { . /etc/os-release && printf '%s%s' "$ID" "$VERSION_ID"; }

# The vendors name architectures differently from dpkg.
vendor_arch() {
  case "$(dpkg --print-architecture)" in
    amd64) printf 'x86_64' ;;
    arm64) printf '%s' "$1" ;;
    *) die "unsupported architecture $(dpkg --print-architecture)" ;;
  esac
}

apt_cleanup() {
  apt-get clean
  rm -rf /var/lib/apt/lists/*
}

install_doca() {
  : "${DOCA_VERSION:?DOCA_VERSION must be set for IB_USERSPACE=doca}"
  : "${DOCA_REPO:?DOCA_REPO must be set for IB_USERSPACE=doca}"
  : "${DOCA_KEY:?DOCA_KEY must be set for IB_USERSPACE=doca (amlhpc/images/pins.toml infiniband.doca_key)}"
  local distro arch repo
  distro="$(os_id)"
  arch="$(vendor_arch arm64-sbsa)"
  repo="${DOCA_REPO}/${DOCA_VERSION}/${distro}/${arch}/"
  log "DOCA-OFED user space ${DOCA_VERSION} from ${repo}"
  install -d -m 0755 /etc/apt/keyrings
  # apt reads ASCII-armoured keys directly when the file ends in .asc. The key is trusted only
  # when it is the pinned one (never on first download).
  curl -fsSL --retry 3 "${DOCA_REPO}/GPG-KEY-Mellanox.pub" -o /etc/apt/keyrings/doca.asc
  "$(dirname "$0")/verify_signing_key.sh" /etc/apt/keyrings/doca.asc "${DOCA_KEY}"
  echo "deb [signed-by=/etc/apt/keyrings/doca.asc] ${repo} ./" > /etc/apt/sources.list.d/doca.list
  apt-get update
  # doca-ofed-userspace: the DOCA-OFED profile without kernel modules (libibverbs, the
  # mlx5 provider, librdmacm, UCX, ibverbs-utils, ofed_info); infiniband-diags: ibstat.
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends doca-ofed-userspace infiniband-diags
  rm -f /etc/apt/sources.list.d/doca.list
  apt_cleanup
}

install_mlnx_ofed() {
  : "${MLNX_OFED_VERSION:?MLNX_OFED_VERSION must be set for IB_USERSPACE=mlnx-ofed}"
  : "${MLNX_OFED_URL:?MLNX_OFED_URL must be set for IB_USERSPACE=mlnx-ofed}"
  [[ -n "${MLNX_OFED_SHA256:-}" ]] || die "MLNX_OFED_SHA256 is empty: set infiniband.mlnx_ofed_sha256 in amlhpc/images/pins.toml to the sha256sum of the tarball"
  local distro arch name work
  distro="$(os_id)"
  arch="$(vendor_arch aarch64)"
  name="MLNX_OFED_LINUX-${MLNX_OFED_VERSION}-${distro}-${arch}"
  work="$(mktemp -d)"
  log "legacy MLNX_OFED user space ${MLNX_OFED_VERSION} (${name})"
  curl -fsSL --retry 3 "${MLNX_OFED_URL}/MLNX_OFED-${MLNX_OFED_VERSION}/${name}.tgz" -o "${work}/${name}.tgz"
  echo "${MLNX_OFED_SHA256}  ${work}/${name}.tgz" | sha256sum --check --strict -
  tar -xzf "${work}/${name}.tgz" -C "${work}"
  apt-get update
  # --user-space-only: no kernel modules (the host has its own); --without-fw-update: never
  # touch the HCA firmware from a container; --without-ucx-cuda: keep the base's CUDA UCX.
  "${work}/${name}/mlnxofedinstall" --user-space-only --without-fw-update --without-ucx-cuda --force
  rm -rf "${work}"
  apt_cleanup
  command -v ibstat >/dev/null || install_diags_from_ubuntu
}

install_diags_from_ubuntu() {
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends infiniband-diags
  apt_cleanup
}

case "$mode" in
  none) log "keeping the base image's rdma-core, HPC-X and NCCL plugin (checked next)"; install_diags_from_ubuntu ;;
  doca) install_doca ;;
  mlnx-ofed) install_mlnx_ofed ;;
  *) die "IB_USERSPACE=${mode} is not one of none, doca, mlnx-ofed" ;;
esac
ldconfig
