"""`jobs beeond`: cluster checks, start/status/stop over a fake SSH runner and a fake MLClient."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from amlhpc.core.errors import UserError
from amlhpc.jobs.beeond import cli as beeond_cli
from amlhpc.jobs.beeond import cluster as beeond
from amlhpc.jobs.beeond import scripts
from amlhpc.jobs.beeond.ssh import OpenSshRunner, SshResult, SshTarget
from amlhpc.jobs.plan import outputs as outputs_module

FIXTURE = Path(__file__).parent / "fixtures" / "outputs" / "dev.json"
PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeFakeFakeFakeFakeFakeFakeFake amlhpc-beeond"
LAYOUT = scripts.Layout()


class FakeNodes:
    """What the nodes would do with each script; records (node, kind) in order."""

    def __init__(self, count: int = 3):
        self.state = {f"node{i}": {"ib": f"172.16.0.{10 + i}", "mounted": False, "installed": False}
                      for i in range(count)}
        self.calls: list[tuple[str, str]] = []
        self.scripts: list[tuple[str, str]] = []
        self.fail: dict[tuple[str, str], str] = {}
        self.start_mounts: set[str] | None = None  # nodes `beeond start` manages to mount (default: all)

    @staticmethod
    def kind(script: str) -> str:
        for marker, kind in (('echo "ib=', "probe"), ("apt-get install", "install"), ("ssh-keygen", "keygen"),
                             ("authorized_keys", "authorize"), ("beeond start", "start"), ("beeond stop", "stop"),
                             ("umount -l", "unmount"), (f"tee {scripts.NODEFILE}", "nodefile")):
            if marker in script:
                return kind
        return "?"

    def run(self, target: SshTarget, script: str, timeout_s: float = 120.0) -> SshResult:
        kind = self.kind(script)
        node = target.node_id
        self.calls.append((node, kind))
        self.scripts.append((node, script))
        if (node, kind) in self.fail:
            return SshResult(1, "", self.fail[(node, kind)])
        st = self.state[node]
        if kind == "probe":
            return SshResult(0, f"ib={st['ib']}\nfstype={'beegfs' if st['mounted'] else 'none'}\n"
                                f"beeond={'installed' if st['installed'] else 'missing'}\n", "")
        if kind == "install":
            st["installed"] = True
        elif kind == "keygen":
            return SshResult(0, PUBKEY + "\n", "")
        elif kind == "start":
            for name, other in self.state.items():
                if self.start_mounts is None or name in self.start_mounts:
                    other["mounted"] = True
        elif kind == "stop":
            for other in self.state.values():
                other["mounted"] = False
        elif kind == "unmount":
            st["mounted"] = False
        return SshResult(0, "", "")

    def kinds(self, kind: str) -> list[str]:
        return [n for n, k in self.calls if k == kind]


def ml_client(mocker, count: int = 3, states: list[str] | None = None):
    states = states or ["idle"] * count
    nodes = [SimpleNamespace(node_id=f"node{i}", public_ip_address="20.1.2.3", private_ip_address=f"10.0.0.{i + 4}",
                             port=50000 + i, node_state=states[i]) for i in range(count)]
    client = mocker.Mock()
    client.compute.list_nodes.return_value = nodes
    return client


def facts(**overrides) -> beeond.ClusterFacts:
    base = dict(stack="dev", name="nd-a100", sku="Standard_ND96asr_v4", min_nodes=3, max_nodes=3, ssh_enabled=True,
                infiniband=True, admin_user="azureuser", config_index=0)
    return beeond.ClusterFacts(**{**base, **overrides})


@pytest.fixture
def fixed_outputs(tmp_path) -> Path:
    """dev outputs with nd-a100 made fixed-size with SSH, as BeeOND needs."""
    doc = json.loads(FIXTURE.read_text())
    doc["clusters"]["nd-a100"].update(minNodes=3, maxNodes=3, sshEnabled=True)
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(doc))
    return path


class TestClusterChecks:
    def test_autoscaling_without_ssh_or_infiniband_lists_every_fix(self):
        loaded = outputs_module.load("dev", outputs_file=FIXTURE).outputs
        with pytest.raises(UserError) as caught:
            beeond.check_cluster(beeond.cluster_facts(loaded, "dev", "nd-a100"))
        text = caught.value.render()
        assert "Pulumi.dev.yaml: aml-hpc:clusters[0].minNodes" in text
        assert "scales between 0 and 2 nodes" in text
        assert "pulumi config set --path 'aml-hpc:clusters[0].minNodes' 2 --stack dev" in text
        assert "pulumi config set --path 'aml-hpc:clusters[0].allowIdleNodes' true --stack dev" in text
        assert "aml-hpc:clusters[0].ssh.publicKey" in text and "SSH disabled" in text

        nc = beeond.cluster_facts(loaded, "dev", "nc-a100")
        with pytest.raises(UserError, match=r"aml-hpc:clusters\[1\].sku.*Standard_NC24ads_A100_v4 has no InfiniBand"):
            beeond.check_cluster(nc)

    def test_unknown_cluster(self):
        loaded = outputs_module.load("dev", outputs_file=FIXTURE).outputs
        with pytest.raises(UserError, match=r"(?s)no cluster named 'nope'.*nc-a100, nd-a100"):
            beeond.cluster_facts(loaded, "dev", "nope")

    def test_fit_cluster_passes(self, fixed_outputs):
        loaded = outputs_module.load("dev", outputs_file=fixed_outputs).outputs
        f = beeond.cluster_facts(loaded, "dev", "nd-a100")
        beeond.check_cluster(f)
        assert (f.min_nodes, f.max_nodes, f.ssh_enabled, f.infiniband, f.config_index) == (3, 3, True, True, 0)


class TestStart:
    def test_installs_and_starts_in_order(self, mocker):
        nodes = FakeNodes()
        state = beeond.start(ml_client(mocker), nodes, facts(), LAYOUT, echo=lambda m: None)
        assert state.state == "mounted"
        assert state.shared_dir_env == {"AMLHPC_SHARED_DIR": "/mnt/beeond"}
        order = [k for _, k in nodes.calls]
        assert order[:3] == ["probe"] * 3 and order[-3:] == ["probe"] * 3
        assert nodes.kinds("install") == ["node0", "node1", "node2"]
        assert nodes.kinds("keygen") == ["node0"]  # the private key is made on the first node only
        assert nodes.kinds("authorize") == ["node0", "node1", "node2"]
        assert nodes.kinds("start") == ["node0"]
        middle = [k for k in order[3:-3]]
        assert middle.index("install") < middle.index("keygen") < middle.index("authorize") < middle.index("nodefile") \
            < middle.index("start")
        nodefile = next(s for n, s in nodes.scripts if nodes.kind(s) == "nodefile")
        assert "172.16.0.10\n172.16.0.11\n172.16.0.12\n" in nodefile  # InfiniBand addresses, first node first
        authorize = next(s for n, s in nodes.scripts if nodes.kind(s) == "authorize")
        assert PUBKEY in authorize
        start = next(s for n, s in nodes.scripts if nodes.kind(s) == "start")
        assert "beeond start -n /var/lib/amlhpc-beeond/nodefile -f /etc/beegfs/amlhpc -d /mnt/resource_nvme/beeond " \
               "-c /mnt/beeond" in start

    def test_ssh_goes_to_public_ip_and_port_as_admin_user(self, mocker):
        nodes = FakeNodes()
        beeond.start(ml_client(mocker), nodes, facts(admin_user="clusteradmin"), LAYOUT, echo=lambda m: None)
        targets = beeond.node_targets(ml_client(mocker), facts(admin_user="clusteradmin"))
        assert [(t.host, t.port, t.user) for t in targets] == [("20.1.2.3", 50000 + i, "clusteradmin") for i in range(3)]
        private = beeond.node_targets(ml_client(mocker), facts(), address="private")
        assert [(t.host, t.port) for t in private] == [(f"10.0.0.{i + 4}", 22) for i in range(3)]

    def test_already_mounted_everywhere_is_a_no_op(self, mocker):
        nodes = FakeNodes()
        for st in nodes.state.values():
            st.update(mounted=True, installed=True)
        messages = []
        state = beeond.start(ml_client(mocker), nodes, facts(), LAYOUT, echo=messages.append)
        assert state.state == "mounted"
        assert {k for _, k in nodes.calls} == {"probe"}
        assert "nothing to do" in messages[0]

    def test_half_mounted_cluster_is_an_error_with_recovery(self, mocker):
        nodes = FakeNodes()
        nodes.state["node1"]["mounted"] = True
        with pytest.raises(beeond.BeeondError) as caught:
            beeond.start(ml_client(mocker), nodes, facts(), LAYOUT, echo=lambda m: None)
        text = str(caught.value)
        assert "mounted on 1 of 3 nodes (mounted: node1; not mounted: node0, node2)" in text
        assert "python -m amlhpc.jobs beeond stop --stack dev --cluster nd-a100" in text
        assert {k for _, k in nodes.calls} == {"probe"}  # nothing was changed

    def test_nodes_not_ready(self, mocker):
        with pytest.raises(beeond.BeeondError, match=r"2 of 3 nodes ready.*node2: preparing"):
            beeond.start(ml_client(mocker, states=["idle", "running", "preparing"]), FakeNodes(), facts(), LAYOUT)

    def test_missing_infiniband_address_names_the_node(self, mocker):
        nodes = FakeNodes()
        nodes.state["node2"]["ib"] = ""
        with pytest.raises(beeond.BeeondError, match=r"no IPv4 address on ib0 on: node2 .*ip addr show ib0"):
            beeond.start(ml_client(mocker), nodes, facts(), LAYOUT, echo=lambda m: None)

    def test_install_failure_names_the_node(self, mocker):
        nodes = FakeNodes()
        nodes.fail[("node1", "install")] = "E: Unable to locate package beeond"
        with pytest.raises(beeond.BeeondError, match=r"(?s)installing BeeOND failed on 1 of 3 node\(s\).*node1.*Unable to locate"):
            beeond.start(ml_client(mocker), nodes, facts(), LAYOUT, echo=lambda m: None)
        assert nodes.kinds("start") == []

    def test_start_that_mounts_only_some_nodes(self, mocker):
        nodes = FakeNodes()
        nodes.start_mounts = {"node0", "node1"}
        with pytest.raises(beeond.BeeondError, match=r"not mounted on: node2.*beeond stop"):
            beeond.start(ml_client(mocker), nodes, facts(), LAYOUT, echo=lambda m: None)

    def test_unfit_cluster_touches_no_node(self, mocker):
        nodes = FakeNodes()
        client = ml_client(mocker)
        with pytest.raises(UserError):
            beeond.start(client, nodes, facts(min_nodes=0), LAYOUT)
        assert nodes.calls == [] and not client.compute.list_nodes.called


class TestStatusAndStop:
    def test_status_reports_nodes_and_mount(self, mocker):
        nodes = FakeNodes()
        nodes.state["node0"]["mounted"] = True
        state = beeond.status(ml_client(mocker), nodes, facts(), LAYOUT)
        doc = state.to_json()
        assert doc["state"] == "partial" and doc["env"] == {}
        assert [n["ib_address"] for n in doc["nodes"]] == ["172.16.0.10", "172.16.0.11", "172.16.0.12"]

    def test_unreachable_node(self, mocker):
        nodes = FakeNodes()
        nodes.fail[("node2", "probe")] = "ssh: connect to host 20.1.2.3 port 50002: Connection timed out"
        with pytest.raises(beeond.BeeondError, match=r"cannot reach node2 .*Connection timed out"):
            beeond.status(ml_client(mocker), nodes, facts(), LAYOUT)

    def test_stop_runs_beeond_stop_once(self, mocker):
        nodes = FakeNodes()
        for st in nodes.state.values():
            st["mounted"] = True
        state = beeond.stop(ml_client(mocker), nodes, facts(), LAYOUT, echo=lambda m: None)
        assert state.state == "stopped"
        assert nodes.kinds("stop") == ["node0"] and nodes.kinds("unmount") == []
        stop_script = next(s for n, s in nodes.scripts if nodes.kind(s) == "stop")
        assert "beeond stop -n /var/lib/amlhpc-beeond/nodefile" in stop_script and " -L -d" in stop_script

    def test_stop_recovers_a_half_mounted_cluster(self, mocker):
        nodes = FakeNodes()
        nodes.state["node2"]["mounted"] = True
        nodes.fail[("node0", "stop")] = "beeond: status file not found"
        state = beeond.stop(ml_client(mocker), nodes, facts(), LAYOUT, echo=lambda m: None)
        assert state.state == "stopped"
        assert nodes.kinds("unmount") == ["node2"]

    def test_stop_when_stopped(self, mocker):
        nodes = FakeNodes()
        assert beeond.stop(ml_client(mocker), nodes, facts(), LAYOUT, echo=lambda m: None).state == "stopped"
        assert {k for _, k in nodes.calls} == {"probe"}


class TestScripts:
    def test_scripts_quote_their_paths(self):
        layout = scripts.Layout(mount="/mnt/bee ond", data_dir="/mnt/resource_nvme/beeond")
        assert "'/mnt/bee ond'" in scripts.probe(layout)
        assert "'/mnt/bee ond'" in scripts.start(layout)

    def test_install_is_idempotent_and_uses_the_nvme_raid(self):
        text = scripts.install(LAYOUT)
        assert "if ! command -v beeond" in text
        assert "if ! mountpoint -q /mnt/resource_nvme" in text
        assert "mdadm --create /dev/md128 --level 0" in text

    def test_the_auth_secret_never_leaves_the_first_node_through_us(self):
        text = scripts.start(LAYOUT)
        assert "/dev/urandom" in text and "scp" in text
        assert "cat " + scripts.CONFIG_DIR + "/connauthfile" not in text


class TestOpenSsh:
    def test_argv_uses_the_key_by_path_and_strict_new_host_checking(self, tmp_path):
        key = tmp_path / "id_ed25519"
        key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nSECRETSECRET\n")
        runner = OpenSshRunner(key, tmp_path / "known_hosts")
        argv = runner.argv(SshTarget("n0", "20.1.2.3", 50000, "azureuser"))
        assert argv[:3] == ["ssh", "-i", str(key)]
        assert "BatchMode=yes" in argv and "StrictHostKeyChecking=accept-new" in argv
        assert f"UserKnownHostsFile={tmp_path / 'known_hosts'}" in argv
        assert argv[-3:] == ["azureuser@20.1.2.3", "bash", "-s"]
        assert not any("SECRET" in a for a in argv)

    def test_missing_ssh_client(self, tmp_path, monkeypatch):
        monkeypatch.setenv("PATH", str(tmp_path))
        result = OpenSshRunner(tmp_path / "k", tmp_path / "kh").run(SshTarget("n0", "127.0.0.1", 1, "u"), "true")
        assert result.returncode == 127 and "not installed" in result.stderr


cli = CliRunner()


class TestCommandLine:
    @pytest.fixture
    def fakes(self, mocker):
        nodes = FakeNodes()
        client = ml_client(mocker)
        mocker.patch.object(beeond_cli, "_ml_client", return_value=client)
        runner_factory = mocker.patch.object(beeond_cli, "_ssh_runner", return_value=nodes)
        return nodes, runner_factory

    def test_start_then_status_json(self, fakes, fixed_outputs):
        nodes, _ = fakes
        started = cli.invoke(beeond_cli.app, ["start", "--stack", "dev", "--cluster", "nd-a100", "--outputs", str(fixed_outputs)])
        assert started.exit_code == 0, started.output
        assert "AMLHPC_SHARED_DIR=/mnt/beeond" in started.output
        status = cli.invoke(beeond_cli.app, ["status", "--stack", "dev", "--cluster", "nd-a100", "--outputs",
                                             str(fixed_outputs), "--json"])
        assert status.exit_code == 0
        doc = json.loads(status.stdout[status.stdout.index("{"):])
        assert doc["state"] == "mounted" and doc["env"] == {"AMLHPC_SHARED_DIR": "/mnt/beeond"}

    def test_status_exit_1_when_not_mounted(self, fakes, fixed_outputs):
        result = cli.invoke(beeond_cli.app, ["status", "--stack", "dev", "--cluster", "nd-a100", "--outputs", str(fixed_outputs)])
        assert result.exit_code == 1 and "stopped" in result.output

    def test_unfit_cluster_exits_2_with_the_fix(self, fakes):
        nodes, runner_factory = fakes
        result = cli.invoke(beeond_cli.app, ["start", "--stack", "dev", "--cluster", "nd-a100", "--outputs", str(FIXTURE)])
        assert result.exit_code == 2
        assert "aml-hpc:clusters[0].minNodes" in result.output and "allowIdleNodes" in result.output
        assert nodes.calls == [] and not runner_factory.called

    def test_bad_mount_option(self, fakes, fixed_outputs):
        result = cli.invoke(beeond_cli.app, ["start", "--stack", "dev", "--cluster", "nd-a100", "--outputs",
                                             str(fixed_outputs), "--mount", "/mnt"])
        assert result.exit_code == 2 and "--mount" in result.output

    def test_failure_exits_1_naming_the_node(self, fakes, fixed_outputs):
        nodes, _ = fakes
        nodes.fail[("node1", "install")] = "E: broken"
        result = cli.invoke(beeond_cli.app, ["start", "--stack", "dev", "--cluster", "nd-a100", "--outputs", str(fixed_outputs)])
        assert result.exit_code == 1 and "node1" in result.output and re.search(r"E: broken", result.output)


def test_missing_key_file_is_bad_input(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        beeond_cli._ssh_runner("dev", "nd-a100", tmp_path / "nope")
