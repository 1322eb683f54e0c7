"""The rules for the stack's network: VNet and subnets, managed isolation's outbound rules, the way in."""

from __future__ import annotations

import ipaddress
import re

from pydantic.alias_generators import to_camel

from amlhpc.core.errors import ProblemCollector
from amlhpc.infra import quirks
from amlhpc.infra.config.clusters import _check_ssh
from amlhpc.infra.config.models import (
    DEFAULT_FQDN_RULES,
    NAMESPACE,
    UNHELD_PUBLIC_KEY,
    HandOffConfig,
    ManagedNetworkSettings,
    RegistrySku,
    SshConfig,
    WayInConfig,
    WayInSubnets,
    _RawConfig,
)
from amlhpc.infra.config.problems import _check_principals, fix_command


def _check_network(found: ProblemCollector, stack: str, raw: _RawConfig) -> tuple[str | None, str | None]:
    net = raw.network
    base = f"{NAMESPACE}network"
    if net.isolation == "public":
        for key in ("address_space", "compute_subnet", "endpoint_subnet"):
            if getattr(net, key):
                found.add(f"{base}.{to_camel(key)}", "is only used with isolation: private or managed",
                          f"remove it, or {fix_command(stack, base + '.isolation', 'private')}")
        return None, None
    managed = net.isolation == "managed"
    if managed and net.compute_subnet:
        found.add(f"{base}.computeSubnet", "is only used with isolation: private: clusters in a managed network "
                  "take no subnet (Azure places them in the workspace's managed VNet)", "remove it")
        return None, None
    if not net.address_space:
        found.add(f"{base}.addressSpace", f"{net.isolation} isolation needs an address space for our VNet",
                  fix_command(stack, f"{base}.addressSpace", "10.40.0.0/16"))
        return None, None
    try:
        space = ipaddress.ip_network(net.address_space, strict=True)
    except ValueError as exc:
        found.add(f"{base}.addressSpace", f"{net.address_space!r} is not a valid CIDR block ({exc})",
                  "use a private range with its network address, e.g. 10.40.0.0/16")
        return None, None
    if not space.is_private or space.version != 4:
        found.add(f"{base}.addressSpace", f"{net.address_space!r} is not a private IPv4 range",
                  "use 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16 space")
        return None, None
    if space.prefixlen > 24:
        found.add(f"{base}.addressSpace", f"{net.address_space!r} is too small for a compute and an endpoint subnet",
                  "use a /24 or larger (a shorter prefix), e.g. 10.40.0.0/16")
        return None, None
    halves = list(space.subnets(prefixlen_diff=1))
    chosen: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for key, default in (("compute_subnet", halves[0]), ("endpoint_subnet", halves[1])):
        text = getattr(net, key)
        if text is None:
            chosen.append(default)
            continue
        try:
            subnet = ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            found.add(f"{base}.{to_camel(key)}", f"{text!r} is not a valid CIDR block ({exc})", f"use e.g. {default}")
            return None, None
        if not subnet.subnet_of(space):  # type: ignore[arg-type]
            found.add(f"{base}.{to_camel(key)}", f"{text} is outside addressSpace {space}", f"use e.g. {default}")
            return None, None
        chosen.append(subnet)
    if not managed and chosen[0].overlaps(chosen[1]):
        found.add(f"{base}.endpointSubnet", f"{chosen[1]} overlaps computeSubnet {chosen[0]}", "give the subnets disjoint ranges")
    return (None if managed else str(chosen[0])), str(chosen[1])


_FQDN = re.compile(r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
_STORAGE_SUFFIXES = (".core.windows.net", ".storage.azure.net")


def default_registry_sku(raw: _RawConfig) -> RegistrySku:
    """The workspace registry's tier when aml-hpc:containerRegistry.sku is not set."""
    return quirks.ACR_SKU["public" if raw.network.isolation == "public" else "private"]


def _check_registry(found: ProblemCollector, stack: str, raw: _RawConfig) -> None:
    sku = raw.container_registry.sku
    if sku and sku != "Premium" and raw.network.isolation != "public":
        found.add(f"{NAMESPACE}containerRegistry.sku",
                  f"{sku} under {raw.network.isolation} isolation: the registry's private endpoint needs Premium",
                  fix_command(stack, f"{NAMESPACE}containerRegistry.sku", "Premium"))


def _check_managed_network(found: ProblemCollector, stack: str, raw: _RawConfig) -> ManagedNetworkSettings | None:
    net = raw.network
    base = f"{NAMESPACE}network"
    if net.isolation != "managed":
        for key in ("outbound", "fqdn_rules", "firewall_sku"):
            if getattr(net, key) is not None:
                found.add(f"{base}.{to_camel(key)}", "is only used with isolation: managed",
                          f"remove it, or {fix_command(stack, base + '.isolation', 'managed')}")
        return None
    outbound = net.outbound or "AllowOnlyApprovedOutbound"
    if outbound == "AllowInternetOutbound":
        if net.fqdn_rules:
            found.add(f"{base}.fqdnRules", "only apply with outbound: AllowOnlyApprovedOutbound "
                      "(AllowInternetOutbound already lets jobs reach every host)",
                      f"remove them, or {fix_command(stack, base + '.outbound', 'AllowOnlyApprovedOutbound')}")
        if net.firewall_sku is not None:
            found.add(f"{base}.firewallSku", "only matters for FQDN rules under outbound: AllowOnlyApprovedOutbound",
                      "remove it")
        return ManagedNetworkSettings(outbound=outbound, fqdn_rules=(), firewall_sku=None)
    rules = list(DEFAULT_FQDN_RULES) if net.fqdn_rules is None else net.fqdn_rules
    seen: set[str] = set()
    for i, host in enumerate(rules):
        path = f"{base}.fqdnRules[{i}]"
        name = host.strip().lower()
        if "://" in name or "/" in name or ":" in name:
            found.add(path, f"{host!r} is not a host name (no scheme, port or path: FQDN rules allow 80 and 443)",
                      "write just the host, e.g. pypi.org")
        elif name.startswith("*"):
            found.add(path, f"{host!r} is a wildcard: it lets jobs send data to every host under "
                      f"{name.lstrip('*.')!r} (any bucket, tunnel or tenant anyone can create there)",
                      "list the exact hosts jobs need (e.g. my-bucket.s3.us-east-1.amazonaws.com), or bake what "
                      "jobs download into the image")
        elif not _FQDN.match(name):
            found.add(path, f"{host!r} is not a fully qualified host name", "e.g. pypi.org")
        elif name.endswith(_STORAGE_SUFFIXES):
            found.add(path, f"{host!r} is an Azure Storage endpoint: an approved-only managed network reaches storage "
                      "through private endpoints, never FQDN rules", "remove it; the dataset account gets a private "
                      "endpoint rule already (add other accounts as outbound private endpoints)")
        elif name in seen:
            found.add(path, f"{host!r} is listed twice", "remove the duplicate")
        seen.add(name)
    if net.firewall_sku is not None and not rules:
        found.add(f"{base}.firewallSku", "no FQDN rules, so Azure deploys no firewall for it to size", "remove it")
    return ManagedNetworkSettings(outbound=outbound, fqdn_rules=tuple(h.strip().lower() for h in rules),
                                  firewall_sku=(net.firewall_sku or "Standard") if rules else None)


# Smallest useful subnet per way in: Azure Bastion needs a /26 named AzureBastionSubnet; a jump
# box needs a handful of addresses (Azure keeps 5 per subnet); runners a few dozen.
_WAY_IN_SLOTS = (("bastion", "Bastion", 26), ("jump_box", "jump box", 28), ("ci_runners", "CI runner", 27))


def _check_way_in(found: ProblemCollector, stack: str, raw: _RawConfig, compute_subnet: str | None,
                  endpoint_subnet: str | None) -> WayInSubnets | None:
    net, way_in = raw.network, raw.network.way_in
    base = f"{NAMESPACE}network.wayIn"
    if way_in is None:
        return None
    if net.isolation == "public":
        found.add(base, "a public stack needs no way in: its workspace and storage take Entra ID sign-ins from anywhere",
                  f"remove it, or {fix_command(stack, NAMESPACE + 'network.isolation', 'managed')}")
        return None
    if way_in.bastion and not way_in.jump_box:
        found.add(f"{base}.bastion", "Bastion connects to a VM, and this way in declares none",
                  f"add a jump box: {fix_command(stack, base + '.jumpBox.publicKey', chr(34) + '$(cat ~/.ssh/id_ed25519.pub)' + chr(34))}")
    if way_in.jump_box:
        box = way_in.jump_box
        _check_ssh(found, stack, f"{base}.jumpBox", SshConfig(enabled=True, public_key=box.public_key, admin_user=box.admin_user))
        if not re.fullmatch(r"Standard_[A-Za-z0-9_]+", box.size):
            found.add(f"{base}.jumpBox.size", f"{box.size!r} is not an Azure VM size name", "e.g. Standard_D2s_v5")
    if not net.address_space or endpoint_subnet is None:
        return None  # the address space problem is reported already
    space = ipaddress.ip_network(net.address_space)
    taken = [ipaddress.ip_network(s) for s in (compute_subnet, endpoint_subnet) if s]
    wanted = {key: getattr(way_in, key) for key, _, _ in _WAY_IN_SLOTS}
    chosen: dict[str, str | None] = {}
    for key, label, prefix in _WAY_IN_SLOTS:  # explicit ranges first: defaults fill around them
        part = wanted[key]
        if part is None or part.subnet is None:
            continue
        path = f"{base}.{to_camel(key)}.subnet"
        try:
            subnet = ipaddress.ip_network(part.subnet, strict=True)
        except ValueError as exc:
            found.add(path, f"{part.subnet!r} is not a valid CIDR block ({exc})", "e.g. 10.40.0.0/26")
            continue
        clash = next((t for t in taken if t.overlaps(subnet)), None)
        if not subnet.subnet_of(space):  # type: ignore[arg-type]
            found.add(path, f"{subnet} is outside addressSpace {space}", "pick a range inside addressSpace")
        elif subnet.prefixlen > prefix:
            found.add(path, f"{subnet} is too small for the {label} subnet", f"use a /{prefix} or larger")
        elif clash is not None:
            found.add(path, f"{subnet} overlaps {clash}, already used in this VNet", "give every subnet its own range")
        else:
            taken.append(subnet)
            chosen[key] = str(subnet)
    for key, label, prefix in _WAY_IN_SLOTS:  # then fixed slots, so enabling one later moves no other
        part = wanted[key]
        if part is not None and part.subnet is not None:
            continue
        slot = _first_free(space, taken, prefix)
        if slot is None:
            if part is not None:
                half = next(ipaddress.ip_network(endpoint_subnet).subnets(prefixlen_diff=1))
                found.add(f"{base}.{to_camel(key)}", f"addressSpace {space} has no free /{prefix} for the {label} "
                          "subnet: the compute and endpoint subnets use all of it (by default they take its halves)",
                          f"give the endpoints less room, e.g. {fix_command(stack, NAMESPACE + 'network.endpointSubnet', str(half))}, "
                          f"or set {to_camel(key)}.subnet")
            continue
        taken.append(slot)
        if part is not None:
            chosen[key] = str(slot)
    return WayInSubnets(bastion=chosen.get("bastion"), bastion_sku=way_in.bastion.sku if way_in.bastion else "Standard",
                        jump_box=chosen.get("jump_box"), ci_runners=chosen.get("ci_runners"))


def _check_seat(found: ProblemCollector, stack: str, raw: _RawConfig, deploying: bool) -> None:
    """A private or managed stack takes no public traffic: people need a seat inside our VNet
    (Bastion with a jump box) or a declared hand-off from their own network (VPN, ExpressRoute,
    peering), and on deploy someone must be able to use the seat."""
    net = raw.network
    if net.isolation == "public":
        return
    base = f"{NAMESPACE}network.wayIn"
    way_in = net.way_in or WayInConfig()
    box, hand_off = way_in.jump_box, way_in.hand_off
    if hand_off is not None:
        _check_hand_off(found, stack, hand_off, net.address_space, f"{base}.handOff")
    if box is not None:
        _check_principals(found, box.logins, f"{base}.jumpBox.logins")
        if box.logins and way_in.bastion and way_in.bastion.sku == "Basic":
            found.add(f"{base}.bastion.sku", "Entra ID sign-in to the jump box goes through Bastion's native-client "
                      "tunnel (az network bastion ssh --auth-type AAD), which Basic does not have",
                      fix_command(stack, f"{base}.bastion.sku", "Standard"))
    if way_in.bastion and not box:
        return  # "Bastion connects to a VM" is reported by _check_way_in
    if not ((way_in.bastion and box) or hand_off):
        key = '"$(cat ~/.ssh/id_ed25519.pub)"'
        found.add(base, f"isolation: {net.isolation} turns public access to the workspace, storage and registries "
                  "off, and this stack declares no way in for people: nobody could submit a job, open studio or "
                  "upload data",
                  f"add Bastion and a jump box: {fix_command(stack, base + '.bastion.sku', 'Standard')} and "
                  f"{fix_command(stack, base + '.jumpBox.publicKey', key)}; or declare the hand-off from your "
                  f"network: {fix_command(stack, base + '.handOff.via', 'VPN')} and "
                  f"{fix_command(stack, base + '.handOff.addressPrefixes[0]', '<your network CIDR>')} "
                  "(docs/isolation.md, A way in)")
        return
    if deploying and box is not None and hand_off is None and not box.logins \
            and (box.public_key or "").strip() == UNHELD_PUBLIC_KEY:
        found.add(f"{base}.jumpBox.logins", "nobody can sign in to the jump box: it names no Entra ID logins, and its "
                  "admin key is the shipped one, whose private half nobody holds",
                  "name who uses it: "
                  f"{fix_command(stack, base + '.jumpBox.logins[0].principalId', '<object id>')} (a group: az ad group "
                  "show -g NAME --query id -o tsv), or replace jumpBox.publicKey with your own break-glass key")


def _check_hand_off(found: ProblemCollector, stack: str, hand_off: HandOffConfig, address_space: str | None,
                    path: str) -> None:
    if not hand_off.address_prefixes:
        found.add(f"{path}.addressPrefixes", f"a {hand_off.via} hand-off names the networks it brings in",
                  fix_command(stack, f"{path}.addressPrefixes[0]", "<your network CIDR>"))
    try:
        space = ipaddress.ip_network(address_space or "", strict=True)
    except ValueError:
        space = None  # its own problem is reported
    for i, text in enumerate(hand_off.address_prefixes):
        try:
            prefix = ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            found.add(f"{path}.addressPrefixes[{i}]", f"{text!r} is not a valid CIDR block ({exc})", "e.g. 10.0.0.0/8")
            continue
        if space is not None and prefix.overlaps(space):
            found.add(f"{path}.addressPrefixes[{i}]", f"{prefix} overlaps addressSpace {space}: routes to our VNet "
                      "and to that network would collide", "give the VNet an address space the network does not use")


def _first_free(space: ipaddress.IPv4Network | ipaddress.IPv6Network, taken: list, prefix: int):
    """The lowest /prefix block of `space` that overlaps nothing in `taken`, or None."""
    if prefix < space.prefixlen:
        return None
    for candidate in space.subnets(new_prefix=prefix):
        if not any(candidate.overlaps(t) for t in taken):
            return candidate
    return None
