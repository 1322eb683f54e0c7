"""A way in that exists: a private or managed stack takes no public traffic, so people need a
seat inside (Azure Bastion and a jump box they sign in to with Entra ID) or a declared
hand-off from their own network, and prod ships with one. A stack without it, or with a jump
box nobody can sign in to, is refused with the key and the fix."""

from __future__ import annotations

import base64
import struct
from datetime import UTC, datetime

import pytest
import yaml

from amlhpc.core.errors import UserError
from amlhpc.core.permissions import MODEL
from amlhpc.infra.config import (
    NAME_SUFFIX_KEY,
    UNHELD_PUBLIC_KEY,
    load_stack_config,
    parse,
    read_stack_file,
)
from amlhpc.infra.plan import evaluate
from amlhpc.infra.plan.mocks import FAKE_SUBSCRIPTION, PlanMocks
from tests.plan_helpers import write_stack
from tests.test_config import GOOD_ENV, PUBKEY

NOW = datetime(2026, 11, 23, tzinfo=UTC)
GROUP = "11111111-2222-3333-4444-555555555555"
PERSON = "66666666-7777-8888-9999-000000000000"
HAND_OFF = {"via": "ExpressRoute", "addressPrefixes": ["172.16.0.0/12"]}
ROLE = "azure-native:authorization:RoleAssignment"


def stack(network: dict) -> dict:
    return {**GOOD_ENV, "aml-hpc:network": {"addressSpace": "10.40.0.0/16", **network}}


def problems(tmp_path, config: dict, deploying: bool = False) -> str:
    write_stack(tmp_path, "stage", config)
    with pytest.raises(UserError) as info:
        parse("stage", read_stack_file("stage", tmp_path), "Pulumi.stage.yaml", now=NOW, deploying=deploying)
    return info.value.render()


def prod_config(**jump_box) -> dict:
    """Pulumi.prod.yaml as shipped, with its name suffix and the jump box's fields changed."""
    config = read_stack_file("prod")
    config["aml-hpc:network"]["wayIn"]["jumpBox"].update(jump_box)
    return {**config, NAME_SUFFIX_KEY: "k3x9q2"}


class TestEveryClosedStackHasASeat:
    @pytest.mark.parametrize("isolation", ["private", "managed"])
    @pytest.mark.parametrize("way_in", [None, {"ciRunners": {}}, {"jumpBox": {"publicKey": PUBKEY}}],
                             ids=["none", "ci-runners-only", "jump-box-without-bastion"])
    def test_no_seat_for_people_is_refused_naming_both_fixes(self, tmp_path, isolation, way_in):
        network = {"isolation": isolation, **({"wayIn": way_in} if way_in else {})}
        text = problems(tmp_path, stack(network))
        assert "aml-hpc:network.wayIn: " in text and "declares no way in for people" in text
        assert "'aml-hpc:network.wayIn.bastion.sku' Standard" in text
        assert "'aml-hpc:network.wayIn.jumpBox.publicKey'" in text
        assert "'aml-hpc:network.wayIn.handOff.via' VPN" in text and "docs/isolation.md" in text

    @pytest.mark.parametrize("way_in", [{"bastion": {}, "jumpBox": {"publicKey": PUBKEY}}, {"handOff": HAND_OFF}],
                             ids=["bastion-and-jump-box", "hand-off"])
    def test_a_seat_is_bastion_with_a_jump_box_or_a_hand_off(self, tmp_path, way_in):
        write_stack(tmp_path, "stage", stack({"isolation": "managed", "wayIn": way_in}))
        assert load_stack_config("stage", tmp_path, now=NOW).network.way_in is not None

    def test_a_public_stack_needs_none(self):
        assert load_stack_config("dev", now=NOW).network.way_in is None

    def test_prod_ships_with_bastion_and_a_jump_box(self):
        prod = load_stack_config("prod", now=NOW)
        assert prod.way_in.bastion and prod.way_in.jump_box and prod.way_in.bastion_sku == "Standard"


class TestBadWayIn:
    @pytest.mark.parametrize("hand_off,fragments", [
        ({"via": "VPN"}, ["handOff.addressPrefixes", "a VPN hand-off names the networks it brings in"]),
        ({"via": "VPN", "addressPrefixes": ["10.40.7.0/24"]},
         ["handOff.addressPrefixes[0]", "overlaps addressSpace 10.40.0.0/16"]),
        ({"via": "VPN", "addressPrefixes": ["10.1.2.3/16"]}, ["handOff.addressPrefixes[0]", "not a valid CIDR"]),
        ({"via": "Carrier pigeon", "addressPrefixes": ["10.0.0.0/16"]}, ["handOff.via", "'Carrier pigeon'"]),
    ])
    def test_a_hand_off_names_real_networks_outside_ours(self, tmp_path, hand_off, fragments):
        text = problems(tmp_path, stack({"isolation": "private", "wayIn": {"handOff": hand_off}}))
        for fragment in fragments:
            assert fragment in text, text

    def test_logins_are_entra_object_ids(self, tmp_path):
        box = {"publicKey": PUBKEY, "logins": [{"principalId": "platform-team"}]}
        text = problems(tmp_path, stack({"isolation": "managed", "wayIn": {"bastion": {}, "jumpBox": box}}))
        assert "aml-hpc:network.wayIn.jumpBox.logins[0].principalId" in text and "not an Entra object id" in text

    def test_entra_sign_in_needs_the_standard_bastion(self, tmp_path):
        box = {"publicKey": PUBKEY, "logins": [{"principalId": GROUP}]}
        text = problems(tmp_path, stack({"isolation": "managed",
                                         "wayIn": {"bastion": {"sku": "Basic"}, "jumpBox": box}}))
        assert "aml-hpc:network.wayIn.bastion.sku" in text and "native-client tunnel" in text
        assert "'aml-hpc:network.wayIn.bastion.sku' Standard" in text


class TestAJumpBoxSomeoneCanUse:
    def test_the_shipped_key_is_a_public_key_nobody_holds(self):
        """A valid OpenSSH ed25519 public key (never a secret), named for what it is."""
        kind, blob, comment = UNHELD_PUBLIC_KEY.split(" ")
        raw = base64.b64decode(blob)
        (length,) = struct.unpack(">I", raw[:4])
        assert kind == "ssh-ed25519" and raw[4:4 + length] == b"ssh-ed25519" and len(raw) == 4 + 11 + 4 + 32
        assert "unheld" in comment and "break-glass" in comment
        assert read_stack_file("prod")["aml-hpc:network"]["wayIn"]["jumpBox"]["publicKey"] == UNHELD_PUBLIC_KEY

    def test_deploying_prod_as_shipped_is_refused_until_someone_can_sign_in(self):
        with pytest.raises(UserError) as info:
            parse("prod", prod_config(), "Pulumi.prod.yaml", now=NOW, deploying=True)
        text = info.value.render()
        assert "aml-hpc:network.wayIn.jumpBox.logins: nobody can sign in to the jump box" in text
        assert "'aml-hpc:network.wayIn.jumpBox.logins[0].principalId' <object id>" in text
        assert load_stack_config("prod", now=NOW)  # the offline plan still shows it

    @pytest.mark.parametrize("change", [{"logins": [{"principalId": GROUP}]}, {"publicKey": PUBKEY}],
                             ids=["entra-logins", "own-break-glass-key"])
    def test_a_login_or_a_key_someone_holds_is_enough(self, change):
        assert parse("prod", prod_config(**change), "Pulumi.prod.yaml", now=NOW, deploying=True)


@pytest.fixture(scope="module")
def prod_with_logins(tmp_path_factory):
    root = tmp_path_factory.mktemp("prod")
    config = prod_config(logins=[{"principalId": GROUP}, {"principalId": PERSON, "principalType": "User"}])
    (root / "Pulumi.prod.yaml").write_text(yaml.safe_dump({"config": config}))
    return evaluate("prod", root, now=NOW)


def arm_id(plan, resource) -> str:
    return PlanMocks(FAKE_SUBSCRIPTION)._arm_id(resource.type, resource.inputs, resource.name)  # noqa: SLF001


class TestTheJumpBoxInThePlan:
    def test_entra_id_sign_in_and_no_password(self, prod_with_logins):
        [vm] = prod_with_logins.of_type("azure-native:compute:VirtualMachine")
        assert vm.inputs["identity"] == {"type": "SystemAssigned"}  # Entra ID login needs it
        linux = vm.inputs["osProfile"]["linuxConfiguration"]
        assert linux["disablePasswordAuthentication"] is True
        assert [k["keyData"] for k in linux["ssh"]["publicKeys"]] == [UNHELD_PUBLIC_KEY]
        assert "networkProfile" in vm.inputs and "publicIPAddress" not in str(vm.inputs)
        [extension] = prod_with_logins.of_type("azure-native:compute:VirtualMachineExtension")
        assert (extension.inputs["publisher"], extension.inputs["type"]) == (
            "Microsoft.Azure.ActiveDirectory", "AADSSHLoginForLinux")
        assert extension.inputs["vmName"] == vm.inputs["vmName"]

    def test_each_login_may_sign_in_to_the_jump_box_and_nothing_else(self, prod_with_logins):
        plan = prod_with_logins
        vm = arm_id(plan, plan.of_type("azure-native:compute:VirtualMachine")[0])
        nic = arm_id(plan, plan.of_type("azure-native:network:NetworkInterface")[0])
        bastion = arm_id(plan, plan.of_type("azure-native:network:BastionHost")[0])
        granted = {(r.inputs["principalId"], r.inputs["roleDefinitionId"].rsplit("/", 1)[-1], r.inputs["scope"],
                    r.inputs["principalType"])
                   for r in plan.of_type(ROLE) if r.name.startswith("way-in-access-")}
        expected = set()
        for who, kind in ((GROUP, "Group"), (PERSON, "User")):
            expected |= {(who, MODEL.role("virtual-machine-user-login").guid, vm, kind),
                         (who, MODEL.role("reader").guid, nic, kind), (who, MODEL.role("reader").guid, bastion, kind)}
        assert granted == expected

    def test_no_logins_no_grants(self):
        plan = evaluate("prod", now=NOW)
        assert not [r for r in plan.of_type(ROLE) if r.name.startswith("way-in-access-")]
        assert plan.of_type("azure-native:compute:VirtualMachineExtension")  # the box still takes Entra ID
