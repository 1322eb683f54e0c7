"""The shell scripts BeeOND management runs on the nodes (bash, sent over SSH on stdin).

Each is idempotent: running it twice leaves the node as running it once does. Steps follow
The BeeOND setup of NAG's CosmoFlow tutorial on Azure ML (NAG, "BeeOND + AzureML", 2021): a root key pair made
on the first node whose public half is authorised on every node (the private half never
leaves that node), BeeGFS's apt repository and the `beeond` package, the client's kernel
module built against the OFED headers, then `beeond start` from the first node over the
node file. The storage targets sit on the NVMe RAID0 of the NDv4 performance article, assembled if needed.

The one secret BeeGFS needs (the connAuthFile shared by all nodes of an instance) is
generated on the first node and copied from there with its root key, so it never passes
through the machine running this tool and is never printed.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

STATE_DIR = "/var/lib/amlhpc-beeond"
NODEFILE = f"{STATE_DIR}/nodefile"
STATUS_FILE = f"{STATE_DIR}/beeond.status"
CONFIG_DIR = "/etc/beegfs/amlhpc"
ROOT_KEY = "/root/.ssh/amlhpc_beeond"
NVME_MOUNT = "/mnt/resource_nvme"  # the NDv4 performance article
BEEGFS_KEY_FINGERPRINT = "0683AF2B9AC5BC7D59B2D62340CE4E243CD50804"
"""The BeeGFS packages' signing key ("The fingerprint of our signing key is 0683 AF2B 9AC5 BC7D
59B2 D623 40CE 4E24 3CD5 0804", BeeGFS download page, https://www.beegfs.io/c/download/, read
2026-11): the downloaded key is trusted only when it is this one."""
MD_DEVICE = "/dev/md128"  # the NDv4 performance article


@dataclass(frozen=True)
class Layout:
    """Where BeeOND lives on every node."""

    mount: str = "/mnt/beeond"
    """The shared filesystem's mount point (AMLHPC_SHARED_DIR for jobs)."""
    data_dir: str = f"{NVME_MOUNT}/beeond"
    """Each node's storage and metadata targets (on the NVMe RAID0)."""
    ib_interface: str = "ib0"
    beegfs_version: str = "7.4.5"


def probe(layout: Layout) -> str:
    """Print `ib=<IPoIB address>`, `fstype=<type at the mount or none>`, `beeond=<installed|missing>`."""
    mount = shlex.quote(layout.mount)
    iface = shlex.quote(layout.ib_interface)
    return f"""set -u
ib=$(ip -o -4 addr show dev {iface} 2>/dev/null | awk '{{split($4, a, "/"); print a[1]; exit}}')
echo "ib=${{ib}}"
fstype=$(awk -v m={mount} '$2 == m {{t = $3}} END {{print t}}' /proc/mounts)
echo "fstype=${{fstype:-none}}"
if command -v beeond >/dev/null 2>&1; then echo beeond=installed; else echo beeond=missing; fi
"""


def install(layout: Layout) -> str:
    """Install BeeOND (skipped when present), build settings for the client, NVMe RAID0, directories."""
    version = shlex.quote(layout.beegfs_version)
    data_dir = shlex.quote(layout.data_dir)
    mount = shlex.quote(layout.mount)
    return f"""set -euo pipefail
sudo -n true 2>/dev/null || {{ echo "password-less sudo is needed on the node" >&2; exit 3; }}
if ! command -v beeond >/dev/null 2>&1; then
  . /etc/os-release
  base=https://www.beegfs.io/release/beegfs_{version}
  key=$(mktemp)
  wget -q -O "$key" "$base/gpg/GPG-KEY-beegfs"
  # Trusted only when the file holds exactly BeeGFS's published key (never on first download).
  keys=$(gpg --batch --with-colons --show-keys "$key" 2>/dev/null || true)
  fpr=$(awk -F: '$1 == "fpr" {{print $10; exit}}' <<<"$keys")
  if [ "$(grep -c '^pub:' <<<"$keys")" != 1 ] || [ "$fpr" != {BEEGFS_KEY_FINGERPRINT} ]; then
    echo "the BeeGFS signing key at $base is not the published one ({BEEGFS_KEY_FINGERPRINT}): refusing it" >&2
    rm -f "$key"; exit 4
  fi
  sudo -n gpg --dearmor --yes -o /etc/apt/trusted.gpg.d/beegfs.gpg < "$key"
  rm -f "$key"
  wget -q -O- "$base/dists/beegfs-${{VERSION_CODENAME}}.list" | sudo -n tee /etc/apt/sources.list.d/beegfs.list >/dev/null
  sudo -n apt-get update -q
  sudo -n DEBIAN_FRONTEND=noninteractive apt-get install -y -q beeond libbeegfs-ib pdsh "linux-headers-$(uname -r)"
fi
# The client module is built at first mount; point it at the OFED headers for RDMA (NAG's CosmoFlow tutorial).
if [ -d /usr/src/ofa_kernel/default/include ]; then
  printf 'buildArgs=-j8 OFED_INCLUDE_PATH=/usr/src/ofa_kernel/default/include\\nbuildEnabled=true\\n' \\
    | sudo -n tee /etc/beegfs/beegfs-client-autobuild.conf >/dev/null
fi
# Storage targets on the NVMe RAID0 (the NDv4 performance article), assembled once per node.
if ! mountpoint -q {NVME_MOUNT}; then
  devs=""
  for d in /sys/block/nvme*; do
    [ -e "$d" ] || continue
    n=$(basename "$d")
    ls "$d" | grep -q "^${{n}}p" && continue          # partitioned: may hold data
    [ -n "$(ls "$d/holders" 2>/dev/null)" ] && continue  # already in an array
    grep -q "^/dev/$n " /proc/mounts && continue
    devs="$devs /dev/$n"
  done
  count=$(echo $devs | wc -w)
  if [ "$count" -gt 1 ]; then
    sudo -n mdadm --create {MD_DEVICE} --level 0 --raid-devices "$count" --run $devs
    sudo -n mkfs.xfs -f {MD_DEVICE}
    sudo -n mkdir -p {NVME_MOUNT}
    sudo -n mount -o noatime {MD_DEVICE} {NVME_MOUNT}
  elif [ "$count" -eq 1 ]; then
    sudo -n mkfs.xfs -f $devs
    sudo -n mkdir -p {NVME_MOUNT}
    sudo -n mount -o noatime $devs {NVME_MOUNT}
  else
    echo "no free NVMe device: BeeOND data goes to {layout.data_dir} on the OS or temp disk" >&2
  fi
fi
sudo -n mkdir -p {data_dir} {mount} {STATE_DIR} {CONFIG_DIR}
# BeeOND reads its configuration from {CONFIG_DIR}: BeeGFS's defaults plus our shared secret file.
for f in /etc/beegfs/beegfs-*.conf; do
  [ -e "$f" ] || continue
  sudo -n cp -n "$f" {CONFIG_DIR}/
  sudo -n sed -i 's#^connAuthFile[[:space:]]*=.*#connAuthFile = {CONFIG_DIR}/connauthfile#' {CONFIG_DIR}/$(basename "$f")
done
echo installed
"""


def root_key() -> str:
    """On the first node: make root's key pair for node-to-node SSH (once); print the public key."""
    return f"""set -euo pipefail
sudo -n test -f {ROOT_KEY} || sudo -n ssh-keygen -q -t ed25519 -N '' -C amlhpc-beeond -f {ROOT_KEY}
sudo -n cat {ROOT_KEY}.pub
"""


def authorize(public_key: str) -> str:
    """On every node: let the first node's root in with `public_key` (appended once)."""
    key = shlex.quote(public_key.strip())
    return f"""set -euo pipefail
sudo -n mkdir -p /root/.ssh
sudo -n chmod 700 /root/.ssh
sudo -n touch /root/.ssh/authorized_keys
sudo -n grep -qxF {key} /root/.ssh/authorized_keys || echo {key} | sudo -n tee -a /root/.ssh/authorized_keys >/dev/null
sudo -n chmod 600 /root/.ssh/authorized_keys
"""


def write_nodefile(addresses: list[str]) -> str:
    """On every node: the node file (InfiniBand addresses, first node first)."""
    body = "\n".join(addresses) + "\n"
    return f"""set -euo pipefail
sudo -n mkdir -p {STATE_DIR}
printf %s {shlex.quote(body)} | sudo -n tee {NODEFILE} >/dev/null
"""


def start(layout: Layout) -> str:
    """On the first node: share the auth secret with the other nodes, then `beeond start` over all of them."""
    data_dir = shlex.quote(layout.data_dir)
    mount = shlex.quote(layout.mount)
    return f"""set -euo pipefail
ssh_opts="-i {ROOT_KEY} -o BatchMode=yes -o StrictHostKeyChecking=accept-new -o ConnectTimeout=15"
if ! sudo -n test -s {CONFIG_DIR}/connauthfile; then
  sudo -n sh -c 'umask 077; head -c 48 /dev/urandom | base64 > {CONFIG_DIR}/connauthfile'
fi
for host in $(tail -n +2 {NODEFILE}); do
  sudo -n scp -q $ssh_opts {CONFIG_DIR}/connauthfile "root@$host:{CONFIG_DIR}/connauthfile"
done
export PDSH_SSH_ARGS_APPEND="$ssh_opts"
# -F: clear what a previous instance left in the data directory; -P: reach the nodes in parallel (pdsh).
sudo -n --preserve-env=PDSH_SSH_ARGS_APPEND beeond start -n {NODEFILE} -f {CONFIG_DIR} -d {data_dir} -c {mount} \\
  -i {STATUS_FILE} -P -F
"""


def stop(layout: Layout) -> str:
    """On the first node: `beeond stop` on all nodes, deleting the instance's data and logs."""
    return f"""set -euo pipefail
export PDSH_SSH_ARGS_APPEND="-i {ROOT_KEY} -o BatchMode=yes -o StrictHostKeyChecking=accept-new"
sudo -n --preserve-env=PDSH_SSH_ARGS_APPEND beeond stop -n {NODEFILE} -i {STATUS_FILE} -P -L -d
"""


def unmount(layout: Layout) -> str:
    """On one node: lazily unmount a leftover BeeOND mount (recovery of a half-mounted cluster)."""
    mount = shlex.quote(layout.mount)
    return f"""set -u
if awk -v m={mount} '$2 == m {{found = 1}} END {{exit !found}}' /proc/mounts; then sudo -n umount -l {mount}; fi
echo unmounted
"""
