"""`python -m amlhpc.jobs beeond start|status|stop --stack S --cluster C` (mounted by amlhpc/jobs/cli/main.py).

start: check the cluster, install and start BeeOND over SSH on all its nodes (idempotent).
status: the state on every node and the mount jobs stage into (AMLHPC_SHARED_DIR);
    exit 0 when mounted everywhere, 1 otherwise. `--json` for scripts and jobs tooling.
stop: stop BeeOND everywhere, deleting its data; also the recovery for a half-mounted cluster.

Exit codes: 0 done, 1 an operation on the nodes failed (the message names them), 2 bad
input (the cluster is not fit for BeeOND, unknown cluster, missing key file).
The SSH private key is used by path only (`ssh -i`); it is never read or printed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table

from amlhpc.core.errors import Problem, UserError, exit_on_bad_input
from amlhpc.jobs.beeond import cluster as beeond
from amlhpc.jobs.beeond import scripts
from amlhpc.jobs.beeond.ssh import OpenSshRunner, SshRunner, default_key, known_hosts_file
from amlhpc.jobs.cli.options import Debug, OutputsFile, Stack

app = typer.Typer(help="BeeOND shared scratch across a fixed-size cluster's nodes (NAG's CosmoFlow tutorial).", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
err = Console(stderr=True)

ClusterName = Annotated[str, typer.Option("--cluster", help="Cluster name (a key of the stack output `clusters`).")]
Offline = Annotated[bool, typer.Option("--offline", help="Check the cluster against the offline plan (status/start still need the deployed nodes).")]
SshKey = Annotated[Path | None, typer.Option("--ssh-key", help="Private key matching the cluster's ssh.publicKey (default: ~/.ssh/id_ed25519, id_ecdsa or id_rsa).")]
Mount = Annotated[str, typer.Option("--mount", help="Mount point of the shared filesystem on every node.")]
DataDir = Annotated[str, typer.Option("--data-dir", help="Where each node keeps its BeeOND storage (on the NVMe RAID0).")]
IbInterface = Annotated[str, typer.Option("--ib-interface", help="IPoIB interface whose addresses form the node file.")]
Address = Annotated[str, typer.Option("--address", help="Reach nodes by their public (default) or private IP.")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print the status as JSON on stdout.")]


def _ml_client(outputs):
    """MLClient for the stack's workspace (tests replace this function)."""
    from amlhpc.jobs.azure import submit

    return submit.connect(outputs)


def _ssh_runner(stack: str, cluster: str, key: Path | None) -> SshRunner:
    """The SSH runner (tests replace this function)."""
    key = key or default_key()
    if key is None:
        raise UserError([Problem("--ssh-key", "", "no SSH private key found in ~/.ssh (id_ed25519, id_ecdsa, id_rsa)",
                                 "pass --ssh-key PATH: the key whose .pub is the cluster's ssh.publicKey")], "invalid options")
    if not key.is_file():
        raise UserError([Problem("--ssh-key", str(key), "no such file", "pass the path of your private key file")],
                        "invalid options")
    return OpenSshRunner(key, known_hosts_file(stack, cluster))


def _context(stack: str, cluster: str, outputs_file: Path | None, offline: bool):
    from amlhpc.jobs.plan import outputs

    loaded = outputs.load(stack, outputs_file=outputs_file, offline=offline).outputs
    return loaded, beeond.cluster_facts(loaded, stack, cluster)


def _layout(mount: str, data_dir: str, ib_interface: str) -> scripts.Layout:
    for flag, value in (("--mount", mount), ("--data-dir", data_dir)):
        if not value.startswith("/") or value.rstrip("/") in ("", "/mnt", "/tmp", "/home", "/root") or ".." in value:
            raise UserError([Problem(flag, value, "must be a dedicated absolute directory",
                                     "e.g. --mount /mnt/beeond --data-dir /mnt/resource_nvme/beeond")], "invalid options")
    return scripts.Layout(mount=mount.rstrip("/"), data_dir=data_dir.rstrip("/"), ib_interface=ib_interface)


def _address(value: str) -> Literal["public", "private"]:
    if value not in ("public", "private"):
        raise UserError([Problem("--address", value, "must be public or private",
                                 "public: through the nodes' public IPs and ports; private: from inside the VNet")],
                        "invalid options")
    return value  # type: ignore[return-value]


def _run(debug: bool, body) -> None:
    try:
        with exit_on_bad_input(debug):
            body()
    except beeond.BeeondError as exc:
        if debug:
            raise
        err.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None


def _print_status(state: beeond.BeeondStatus, as_json: bool) -> None:
    if as_json:
        print(json.dumps(state.to_json(), indent=2))
        return
    table = Table(title=f"BeeOND on {state.cluster} ({state.stack}): {state.state}")
    for column in ("node", "ssh", "InfiniBand", "mounted at " + state.mount):
        table.add_column(column)
    for node in state.nodes:
        table.add_row(node.target.node_id, f"{node.target.host}:{node.target.port}", node.ib_address or "-",
                      "yes" if node.mounted else "no")
    err.print(table)
    if state.state == "mounted":
        err.print(f"jobs stage into it with {next(iter(state.shared_dir_env))}={state.mount} (staging mode 'shared')",
                  highlight=False)


def _echo(message: str) -> None:
    err.print(message, highlight=False)


@app.command("start")
def start_command(stack: Stack, cluster: ClusterName, outputs_file: OutputsFile = None, offline: Offline = False,
                  ssh_key: SshKey = None, mount: Mount = "/mnt/beeond", data_dir: DataDir = "/mnt/resource_nvme/beeond",
                  ib_interface: IbInterface = "ib0", address: Address = "public", json_out: JsonOut = False,
                  debug: Debug = False) -> None:
    """Install and start BeeOND on all nodes of a fixed-size cluster (nothing happens when it already runs)."""
    def body() -> None:
        layout = _layout(mount, data_dir, ib_interface)
        via = _address(address)
        outputs, facts = _context(stack, cluster, outputs_file, offline)
        beeond.check_cluster(facts)
        runner = _ssh_runner(stack, cluster, ssh_key)
        state = beeond.start(_ml_client(outputs), runner, facts, layout, _echo, via)
        _print_status(state, json_out)

    _run(debug, body)


@app.command("status")
def status_command(stack: Stack, cluster: ClusterName, outputs_file: OutputsFile = None, offline: Offline = False,
                   ssh_key: SshKey = None, mount: Mount = "/mnt/beeond", ib_interface: IbInterface = "ib0",
                   address: Address = "public", json_out: JsonOut = False, debug: Debug = False) -> None:
    """Where BeeOND is mounted; exit 0 only when every node has it."""
    state_box: list[beeond.BeeondStatus] = []

    def body() -> None:
        layout = _layout(mount, "/mnt/resource_nvme/beeond", ib_interface)
        via = _address(address)
        outputs, facts = _context(stack, cluster, outputs_file, offline)
        runner = _ssh_runner(stack, cluster, ssh_key)
        state = beeond.status(_ml_client(outputs), runner, facts, layout, via)
        _print_status(state, json_out)
        state_box.append(state)

    _run(debug, body)
    if state_box and state_box[0].state != "mounted":
        raise typer.Exit(1)


@app.command("stop")
def stop_command(stack: Stack, cluster: ClusterName, outputs_file: OutputsFile = None, offline: Offline = False,
                 ssh_key: SshKey = None, mount: Mount = "/mnt/beeond", data_dir: DataDir = "/mnt/resource_nvme/beeond",
                 ib_interface: IbInterface = "ib0", address: Address = "public", json_out: JsonOut = False,
                 debug: Debug = False) -> None:
    """Stop BeeOND on all nodes and delete its data (also recovers a half-mounted cluster)."""
    def body() -> None:
        layout = _layout(mount, data_dir, ib_interface)
        via = _address(address)
        outputs, facts = _context(stack, cluster, outputs_file, offline)
        runner = _ssh_runner(stack, cluster, ssh_key)
        state = beeond.stop(_ml_client(outputs), runner, facts, layout, _echo, via)
        _print_status(state, json_out)

    _run(debug, body)
