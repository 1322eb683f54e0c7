"""BeeOND on an Azure ML cluster: check the cluster, find its nodes, start, report, stop.

The flow (`start`), each step in parallel over the nodes where it can be:

1. The cluster must be fixed-size (minNodes == maxNodes: a scale-down would take a node
   and the part of the filesystem on it), have SSH enabled, and have InfiniBand (the node
   file lists InfiniBand addresses, so BeeGFS traffic goes over IB). Each violation is a
   `UserError` naming the key in Pulumi.<stack>.yaml and the `pulumi config set` fixing it.
2. Nodes come from `ml_client.compute.list_nodes(cluster)`; all maxNodes must be up.
3. Every node is probed over SSH: its IPoIB address, whether BeeOND is mounted, whether it
   is installed. All mounted: nothing to do (start is idempotent). Some mounted: a
   half-mounted cluster is an error naming the nodes, with the recovery (stop, start).
4. Install (idempotent), authorise the first node's root key everywhere, write the node
   file (IB addresses, first node first), run `beeond start` on the first node, then probe
   again: every node must show the BeeGFS mount, else the error names the ones missing.

`status` reports the state and the mount jobs stage into (`AMLHPC_SHARED_DIR`, `shared`
staging mode); `stop` runs `beeond stop` (deleting the instance's data) and unmounts any
leftover, so it is also the recovery from a half-started instance.

The MLClient and the SSH runner are arguments: tests pass fakes that record calls.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from amlhpc.core import invocation
from amlhpc.core.errors import Problem, UserError
from amlhpc.jobs.beeond import scripts
from amlhpc.jobs.beeond.ssh import SshResult, SshRunner, SshTarget
from amlhpc.jobs.runtime.base.contract import SHARED_DIR

READY_STATES = {"idle", "running"}
BEEGFS_FSTYPE = "beegfs"
Echo = Callable[[str], None]
State = Literal["mounted", "stopped", "partial"]


class BeeondError(RuntimeError):
    """An operation on the nodes failed; the message names the nodes and the way out."""


@dataclass(frozen=True)
class ClusterFacts:
    """What the stack says about the cluster."""

    stack: str
    name: str
    sku: str
    min_nodes: int
    max_nodes: int
    ssh_enabled: bool
    infiniband: bool
    admin_user: str = "azureuser"
    config_index: int | None = None
    """Position in aml-hpc:clusters of Pulumi.<stack>.yaml, for fix commands."""

    @property
    def stack_file(self) -> str:
        return f"Pulumi.{self.stack}.yaml"

    def key(self, field_name: str) -> str:
        index = self.config_index if self.config_index is not None else "<i>"
        return f"aml-hpc:clusters[{index}].{field_name}"


def cluster_facts(outputs, stack: str, cluster: str, root: Path | None = None) -> ClusterFacts:
    """Facts about `cluster` from the stack outputs (deployed state) and the stack file (admin user, index)."""
    clusters = outputs.clusters
    if cluster not in clusters:
        known = ", ".join(sorted(clusters)) or "none"
        raise UserError([Problem(f"stack {stack} outputs", "clusters", f"no cluster named {cluster!r}",
                                 f"clusters in this stack: {known}")], "unknown cluster")
    info = clusters[cluster]
    admin_user, index = "azureuser", None
    try:
        from amlhpc.infra.config import REPO_ROOT, load_stack_config

        config = load_stack_config(stack, root or REPO_ROOT)
        for i, declared in enumerate(config.clusters):
            if declared.name == cluster:
                index = i
                if declared.ssh is not None:
                    admin_user = declared.ssh.admin_user
    except UserError:
        pass  # the outputs are what counts; the stack file only improves the messages
    return ClusterFacts(stack=stack, name=cluster, sku=info.sku, min_nodes=info.min_nodes, max_nodes=info.max_nodes,
                        ssh_enabled=info.ssh_enabled, infiniband=bool(info.infiniband),
                        admin_user=admin_user, config_index=index)


def check_cluster(facts: ClusterFacts) -> None:
    """Raise one UserError with everything that stops BeeOND on this cluster."""
    from amlhpc.infra.config import fix_command

    problems: list[Problem] = []
    if facts.min_nodes != facts.max_nodes:
        problems.append(Problem(
            facts.stack_file, facts.key("minNodes"),
            f"cluster {facts.name!r} scales between {facts.min_nodes} and {facts.max_nodes} nodes; BeeOND needs a "
            "fixed size, because scaling down removes a node together with its part of the filesystem",
            f"{fix_command(facts.stack, facts.key('minNodes'), str(facts.max_nodes))} and "
            f"{fix_command(facts.stack, facts.key('allowIdleNodes'), 'true')} (the nodes then bill while idle), "
            f"then `pulumi up --stack {facts.stack}`"))
    if not facts.ssh_enabled:
        problems.append(Problem(
            facts.stack_file, facts.key("ssh.publicKey"),
            f"cluster {facts.name!r} has SSH disabled; BeeOND is installed and started over SSH",
            f"{fix_command(facts.stack, facts.key('ssh.publicKey'), chr(34) + '$(cat ~/.ssh/id_ed25519.pub)' + chr(34))}, "
            f"then `pulumi up --stack {facts.stack}` (this recreates the cluster)"))
    if not facts.infiniband:
        problems.append(Problem(
            facts.stack_file, facts.key("sku"),
            f"{facts.sku} has no InfiniBand; BeeOND here serves the filesystem over the nodes' InfiniBand addresses",
            "use an InfiniBand size (an 'r' in the name, e.g. Standard_ND96asr_v4) for BeeOND clusters"))
    if problems:
        raise UserError(problems, f"cluster {facts.name!r} cannot host BeeOND")


def node_targets(ml_client, facts: ClusterFacts, address: Literal["public", "private"] = "public") -> list[SshTarget]:
    """SSH targets for all the cluster's nodes, sorted by node id; every node must be up."""
    from amlhpc.jobs.azure.submit import cluster_nodes  # the one module that talks to MLClient

    infos = cluster_nodes(ml_client, facts.name)
    ready = [n for n in infos if str(getattr(n, "node_state", "")).lower() in READY_STATES]
    if len(ready) < facts.max_nodes or len(infos) != len(ready):
        states = ", ".join(f"{getattr(n, 'node_id', '?')}: {getattr(n, 'node_state', '?')}" for n in infos) or "no nodes"
        raise BeeondError(
            f"cluster {facts.name!r} has {len(ready)} of {facts.max_nodes} nodes ready ({states}); wait until all are "
            "idle or running (a fixed-size cluster allocates its nodes after `pulumi up`), then retry")
    targets = []
    for node in sorted(ready, key=lambda n: str(n.node_id)):
        public = getattr(node, "public_ip_address", None)
        if address == "public" and public:
            targets.append(SshTarget(str(node.node_id), public, int(getattr(node, "port", None) or 22), facts.admin_user))
        else:
            private = getattr(node, "private_ip_address", None)
            if not private:
                raise BeeondError(f"node {node.node_id} reports no IP address to reach it over SSH")
            targets.append(SshTarget(str(node.node_id), private, 22, facts.admin_user))
    return targets


@dataclass
class NodeProbe:
    target: SshTarget
    ib_address: str | None = None
    fstype: str = "none"
    installed: bool = False
    error: str | None = None

    @property
    def mounted(self) -> bool:
        return self.fstype == BEEGFS_FSTYPE

    def to_json(self) -> dict[str, Any]:
        return {"node_id": self.target.node_id, "host": self.target.host, "port": self.target.port,
                "ib_address": self.ib_address, "mounted": self.mounted, "fstype": self.fstype,
                "installed": self.installed, "error": self.error}


@dataclass
class BeeondStatus:
    stack: str
    cluster: str
    mount: str
    nodes: list[NodeProbe] = field(default_factory=list)

    @property
    def state(self) -> State:
        mounted = sum(n.mounted for n in self.nodes)
        if self.nodes and mounted == len(self.nodes):
            return "mounted"
        return "stopped" if mounted == 0 else "partial"

    @property
    def shared_dir_env(self) -> dict[str, str]:
        """What a job staging in `shared` mode needs (empty unless mounted everywhere)."""
        return {SHARED_DIR: self.mount} if self.state == "mounted" else {}

    def to_json(self) -> dict[str, Any]:
        return {"stack": self.stack, "cluster": self.cluster, "state": self.state, "mount": self.mount,
                "env": self.shared_dir_env, "nodes": [n.to_json() for n in self.nodes]}


_IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")


def _parallel(runner: SshRunner, targets: Sequence[SshTarget], script: Callable[[SshTarget], str],
              timeout_s: float) -> list[SshResult]:
    with ThreadPoolExecutor(max(1, min(32, len(targets)))) as pool:
        return list(pool.map(lambda t: runner.run(t, script(t), timeout_s), targets))


def probe(runner: SshRunner, targets: Sequence[SshTarget], layout: scripts.Layout) -> list[NodeProbe]:
    results = _parallel(runner, targets, lambda t: scripts.probe(layout), 60)
    probes = []
    for target, result in zip(targets, results, strict=True):
        node = NodeProbe(target)
        if not result.ok:
            node.error = f"SSH failed: {result.tail()}"
        else:
            values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
            address = values.get("ib", "").strip()
            node.ib_address = address if _IPV4.match(address) else None
            node.fstype = values.get("fstype", "none").strip() or "none"
            node.installed = values.get("beeond", "").strip() == "installed"
        probes.append(node)
    return probes


def _fail_on_errors(step: str, targets: Sequence[SshTarget], results: Sequence[SshResult]) -> None:
    failed = [f"{t}: {r.tail()}" for t, r in zip(targets, results, strict=True) if not r.ok]
    if failed:
        raise BeeondError(f"{step} failed on {len(failed)} of {len(targets)} node(s):\n  - " + "\n  - ".join(failed))


def _recovery(facts: ClusterFacts) -> str:
    where = f"--stack {facts.stack} --cluster {facts.name}"
    return (f"recover with `{invocation.command('jobs', 'beeond stop ' + where)}` (unmounts "
            f"everywhere, deletes BeeOND's data), then `{invocation.command('jobs', 'beeond start ' + where)}`")


def status(ml_client, runner: SshRunner, facts: ClusterFacts, layout: scripts.Layout,
           address: Literal["public", "private"] = "public") -> BeeondStatus:
    targets = node_targets(ml_client, facts, address)
    nodes = probe(runner, targets, layout)
    unreachable = [n for n in nodes if n.error]
    if unreachable:
        raise BeeondError("cannot reach " + ", ".join(f"{n.target}: {n.error}" for n in unreachable))
    return BeeondStatus(facts.stack, facts.name, layout.mount, nodes)


def start(ml_client, runner: SshRunner, facts: ClusterFacts, layout: scripts.Layout, echo: Echo = print,
          address: Literal["public", "private"] = "public") -> BeeondStatus:
    """Start BeeOND over all the cluster's nodes (see the module docstring); idempotent."""
    check_cluster(facts)
    current = status(ml_client, runner, facts, layout, address)
    if current.state == "mounted":
        echo(f"BeeOND is already mounted at {layout.mount} on all {len(current.nodes)} nodes: nothing to do")
        return current
    if current.state == "partial":
        mounted = [n.target.node_id for n in current.nodes if n.mounted]
        missing = [n.target.node_id for n in current.nodes if not n.mounted]
        raise BeeondError(f"BeeOND is mounted on {len(mounted)} of {len(current.nodes)} nodes (mounted: "
                          f"{', '.join(mounted)}; not mounted: {', '.join(missing)}); a half-mounted instance cannot be "
                          f"completed in place: {_recovery(facts)}")
    no_ib = [n for n in current.nodes if not n.ib_address]
    if no_ib:
        raise BeeondError(f"no IPv4 address on {layout.ib_interface} on: " + ", ".join(str(n.target) for n in no_ib)
                          + f"; check `ip addr show {layout.ib_interface}` there (InfiniBand driver up?), or pass "
                          "--ib-interface")
    targets = [n.target for n in current.nodes]
    first = targets[0]

    echo(f"installing BeeOND {layout.beegfs_version} on {len(targets)} nodes (skipped where installed)")
    _fail_on_errors("installing BeeOND", targets, _parallel(runner, targets, lambda t: scripts.install(layout), 1800))

    echo(f"authorising {first.node_id}'s root key on all nodes")
    key = runner.run(first, scripts.root_key(), 120)
    public_key = key.stdout.strip().splitlines()[-1] if key.ok and key.stdout.strip() else ""
    if not re.match(r"^ssh-ed25519 [A-Za-z0-9+/=]+( .*)?$", public_key):
        raise BeeondError(f"could not create root's key pair on {first}: {key.tail()}")
    _fail_on_errors("authorising the key", targets, _parallel(runner, targets, lambda t: scripts.authorize(public_key), 120))

    addresses = [n.ib_address for n in current.nodes]
    echo(f"node file: {', '.join(addresses)}")  # type: ignore[arg-type]
    _fail_on_errors("writing the node file", targets,
                    _parallel(runner, targets, lambda t: scripts.write_nodefile(addresses), 120))  # type: ignore[arg-type]

    echo(f"starting BeeOND from {first.node_id}: data in {layout.data_dir}, mounted at {layout.mount}")
    started = runner.run(first, scripts.start(layout), 1800)
    if not started.ok:
        raise BeeondError(f"`beeond start` failed on {first}: {started.tail(5)}; {_recovery(facts)}")

    after = status(ml_client, runner, facts, layout, address)
    if after.state != "mounted":
        missing = [n.target.node_id for n in after.nodes if not n.mounted]
        raise BeeondError(f"BeeOND started but is not mounted on: {', '.join(missing)}; {_recovery(facts)}")
    echo(f"BeeOND mounted at {layout.mount} on all {len(after.nodes)} nodes; jobs stage into it with "
         f"{SHARED_DIR}={layout.mount} (staging mode 'shared')")
    return after


def stop(ml_client, runner: SshRunner, facts: ClusterFacts, layout: scripts.Layout, echo: Echo = print,
         address: Literal["public", "private"] = "public") -> BeeondStatus:
    """Stop BeeOND everywhere and delete its data; also clears a half-mounted instance."""
    current = status(ml_client, runner, facts, layout, address)
    if current.state == "stopped":
        echo("BeeOND is not mounted on any node: nothing to stop")
        return current
    first = current.nodes[0].target
    echo(f"stopping BeeOND from {first.node_id} (its data is deleted)")
    stopped = runner.run(first, scripts.stop(layout), 900)
    if not stopped.ok:
        echo(f"`beeond stop` reported a problem ({stopped.tail()}); unmounting what is left node by node")
    leftover = [n.target for n in status(ml_client, runner, facts, layout, address).nodes if n.mounted]
    if leftover:
        _fail_on_errors("unmounting", leftover, _parallel(runner, leftover, lambda t: scripts.unmount(layout), 120))
    after = status(ml_client, runner, facts, layout, address)
    if after.state != "stopped":
        still = [n.target.node_id for n in after.nodes if n.mounted]
        raise BeeondError(f"BeeOND is still mounted on {', '.join(still)}; log in and run `sudo umount -l {layout.mount}`")
    echo(f"BeeOND stopped on all {len(after.nodes)} nodes")
    return after
