"""Hosts with their own network stacks on one machine, for tests that cut the network between processes.

``NetLab`` makes a Linux bridge and one network namespace per host (``ip netns``, from iproute2), each host
with one address on the bridge's subnet. The test process stays in the root namespace and reaches every
host through the bridge, like a client on the LAN. ``cut(a, b)`` drops every packet between two hosts in
both directions (iptables DROP rules inside each namespace), so their TCP connections stall exactly as on
a partitioned network, while clients still reach both; ``uncut(a, b)`` restores that link, ``heal`` every
link. ``cut_port(host, address, port)`` drops only ``host``'s TCP traffic with one service (a proxy on the
bridge's own address, which clients in the root namespace also use as their source address).

Needs root (CAP_NET_ADMIN); ``NetLab.available()`` says whether this machine allows it, so a test can skip
with the reason. Everything a lab creates carries its name prefix and is removed by ``close()`` (and by
``remove_leftovers`` for labs of test processes that died).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NetLab", "Host"]

IP = shutil.which("ip")
IPTABLES = shutil.which("iptables")
PREFIX = "cl"
# One file per live lab: its owner's pid and what it created, so a later run can remove the leftovers of a
# test process that died without closing its lab.
REGISTRY = Path("/tmp/copyless-netlabs")


def _ip(*args: str, namespace: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    command = [IP, *args] if namespace is None else [IP, "netns", "exec", namespace, IP, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()}")
    return result


@dataclass
class Host:
    name: str
    namespace: str
    address: str


class NetLab:
    """A bridge and namespaced hosts; see the module docstring."""

    def __init__(self, tag: str | None = None) -> None:
        self.tag = tag or f"{random.randrange(10**6):06d}"
        self.bridge = f"{PREFIX}br{self.tag}"
        # A private /24 per lab from 10.200-249.x.0, so parallel labs never share addresses.
        self.subnet = f"10.{200 + random.randrange(50)}.{random.randrange(256)}"
        self.gateway = f"{self.subnet}.1"
        self.hosts: dict[str, Host] = {}
        self._cuts: set[tuple[str, str]] = set()
        self._port_cuts: set[tuple[str, str, int]] = set()
        self._created = False

    @staticmethod
    def available() -> tuple[bool, str]:
        if IP is None or IPTABLES is None:
            return False, "iproute2 (ip) and iptables are needed to cut the network between processes"
        if os.geteuid() != 0:
            return False, "network namespaces need root"
        probe = f"{PREFIX}probe{os.getpid()}"
        result = _ip("netns", "add", probe, check=False)
        if result.returncode != 0:
            return False, f"cannot create a network namespace: {result.stderr.strip()}"
        _ip("netns", "del", probe, check=False)
        return True, ""

    def _record(self) -> None:
        REGISTRY.mkdir(exist_ok=True)
        (REGISTRY / self.bridge).write_text(json.dumps(
            {"pid": os.getpid(), "bridge": self.bridge, "namespaces": [h.namespace for h in self.hosts.values()]}))

    def start(self) -> NetLab:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._created = True
        self._record()
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        # With bridge netfilter on (Docker turns it on and sets FORWARD's policy to DROP), frames between two
        # ports of a bridge pass the iptables FORWARD chain: let this bridge's own traffic through.
        if IPTABLES is not None:
            subprocess.run([IPTABLES, "-I", "FORWARD", *self._forward_rule()], capture_output=True, timeout=30)
        return self

    def _forward_rule(self) -> list[str]:
        return ["-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]

    def add_host(self, name: str) -> Host:
        index = len(self.hosts) + 10
        namespace = f"{PREFIX}{self.tag}{name}"
        outside, inside = f"{PREFIX}v{self.tag}{index}", "eth0"
        address = f"{self.subnet}.{index}"
        _ip("netns", "add", namespace)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside, "netns", namespace)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("addr", "add", f"{address}/24", "dev", inside, namespace=namespace)
        _ip("link", "set", inside, "up", namespace=namespace)
        _ip("link", "set", "lo", "up", namespace=namespace)
        host = self.hosts[name] = Host(name, namespace, address)
        self._record()
        return host

    def command(self, host: Host, argv: list[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace."""
        return [IP, "netns", "exec", host.namespace, *argv]

    def _drop_rules(self, host: Host, other: Host) -> list[list[str]]:
        return [["OUTPUT", "-d", other.address, "-j", "DROP"], ["INPUT", "-s", other.address, "-j", "DROP"]]

    def _iptables(self, host: Host, action: str, rule: list[str]) -> None:
        subprocess.run([IP, "netns", "exec", host.namespace, IPTABLES, action, *rule], capture_output=True,
                       check=action == "-A", timeout=30)

    def cut(self, a: Host, b: Host) -> None:
        """Drop every packet between ``a`` and ``b``, both ways, silently (iptables DROP in each namespace:
        senders see no error, their TCP connections stall and time out, as across a failed network)."""
        for host, other in ((a, b), (b, a)):
            for rule in self._drop_rules(host, other):
                self._iptables(host, "-A", rule)
        self._cuts.add((a.name, b.name))

    def uncut(self, a: Host, b: Host) -> None:
        """Undo ``cut(a, b)`` (either order)."""
        for key in ((a.name, b.name), (b.name, a.name)):
            if key in self._cuts:
                self._cuts.discard(key)
                for host, other in ((a, b), (b, a)):
                    for rule in self._drop_rules(host, other):
                        self._iptables(host, "-D", rule)

    @staticmethod
    def _port_rules(address: str, port: int) -> list[list[str]]:
        return [["OUTPUT", "-d", address, "-p", "tcp", "--dport", str(port), "-j", "DROP"],
                ["INPUT", "-s", address, "-p", "tcp", "--sport", str(port), "-j", "DROP"]]

    def cut_port(self, host: Host, address: str, port: int) -> None:
        """Drop ``host``'s TCP packets to and from ``address:port``, silently, both ways."""
        if (host.name, address, port) in self._port_cuts:
            return
        for rule in self._port_rules(address, port):
            self._iptables(host, "-A", rule)
        self._port_cuts.add((host.name, address, port))

    def uncut_port(self, host: Host, address: str, port: int) -> None:
        if (host.name, address, port) in self._port_cuts:
            self._port_cuts.discard((host.name, address, port))
            for rule in self._port_rules(address, port):
                self._iptables(host, "-D", rule)

    def isolate(self, host: Host) -> None:
        """Cut ``host`` off from every other host (clients in the root namespace still reach it)."""
        for other in self.hosts.values():
            if other is not host and (host.name, other.name) not in self._cuts:
                self.cut(host, other)

    def heal(self) -> None:
        for a_name, b_name in list(self._cuts):
            a, b = self.hosts[a_name], self.hosts[b_name]
            for host, other in ((a, b), (b, a)):
                for rule in self._drop_rules(host, other):
                    self._iptables(host, "-D", rule)
        self._cuts.clear()
        for name, address, port in list(self._port_cuts):
            self.uncut_port(self.hosts[name], address, port)

    def close(self) -> None:
        for host in self.hosts.values():
            _ip("netns", "del", host.namespace, check=False)
        if self._created:
            if IPTABLES is not None:
                subprocess.run([IPTABLES, "-D", "FORWARD", *self._forward_rule()], capture_output=True, timeout=30)
            _ip("link", "del", self.bridge, check=False)
            (REGISTRY / self.bridge).unlink(missing_ok=True)
        self.hosts.clear()

    @staticmethod
    def remove_leftovers() -> None:
        """Delete the namespaces and bridge of every lab whose test process is gone."""
        if not REGISTRY.is_dir():
            return
        for entry in REGISTRY.iterdir():
            record = None  # an unreadable entry (a run killed while writing it) is a leftover too, once old
            try:
                record = json.loads(entry.read_text())
                os.kill(int(record["pid"]), 0)
                continue  # its owner is alive
            except ProcessLookupError:
                pass
            except (ValueError, KeyError, OSError):
                # Unreadable: a lab writing it right now (write_text is not atomic), or one whose write failed
                # (a full disk leaves it empty). Only an entry no one has touched for a minute is a leftover.
                try:
                    if time.time() - entry.stat().st_mtime < 60:
                        continue
                except OSError:
                    continue
            for namespace in record.get("namespaces", []) if isinstance(record, dict) else []:
                _ip("netns", "del", namespace, check=False)
            if IPTABLES is not None:
                subprocess.run([IPTABLES, "-D", "FORWARD", "-i", entry.name, "-o", entry.name, "-j", "ACCEPT"],
                               capture_output=True, timeout=30)
            _ip("link", "del", entry.name, check=False)
            entry.unlink(missing_ok=True)
