"""Two "hosts" on one machine, for multi-node tests: network namespaces joined by a veth pair.

Each host is a Linux network namespace with its own interface and address on a private /24, so a
torchrun agent (or any command) started in it reaches the other host over that link and not over
loopback, as on two machines: rendezvous, gloo's collectives and the cache's exchange all cross it, and
the link can be taken down or slowed (``tc netem``) to test faults. Needs root and iproute2;
:func:`unavailable` says why not, for tests to skip with that reason.

    with VirtualHosts(2) as hosts:
        hosts[0].popen(["python", "-c", "..."])        # inside host 0's namespace
        hosts[1].address                               # e.g. "10.77.12.2"
        hosts.set_link(up=False)                       # both ends down
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> str | None:
    """Why namespaced hosts cannot be made here (not root, no iproute2, namespaces refused), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    probe = f"lsm-probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"'ip netns add' failed: {made.stderr.strip() or made.returncode}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    """One namespaced host: its namespace, interface and address."""

    namespace: str
    interface: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def env(self, base: dict | None = None) -> dict:
        """Environment for a rank on this host: gloo binds to the host's link, not to loopback."""
        env = dict(os.environ if base is None else base)
        env["GLOO_SOCKET_IFNAME"] = self.interface
        return env

    def popen(self, argv: list[str], env: dict | None = None, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), env=self.env(env), **kwargs)


class VirtualHosts:
    """Two namespaced hosts joined by one veth pair; made on enter, removed on exit.

    Names carry the process id, so concurrent test runs do not collide; the subnet is 10.77.<k>.0/24 with
    ``k`` from the process id.
    """

    def __init__(self, count: int = 2):
        if count != 2:
            raise ValueError(f"VirtualHosts joins exactly 2 hosts by one veth pair, got {count}")
        tag = os.getpid() % 100_000
        subnet = 1 + os.getpid() % 250
        self.hosts = [Host(f"lsm-h{k}-{tag}", f"lsm{k}-{tag}", f"10.77.{subnet}.{k + 1}") for k in range(count)]

    def __enter__(self) -> VirtualHosts:
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(f"cannot make namespaced hosts: {reason}")
        a, b = self.hosts
        try:
            for host in self.hosts:
                _ip("netns", "add", host.namespace)
            _ip("link", "add", a.interface, "type", "veth", "peer", "name", b.interface)
            for host in self.hosts:
                _ip("link", "set", host.interface, "netns", host.namespace)
                _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
                _ip("-n", host.namespace, "link", "set", "lo", "up")
                _ip("-n", host.namespace, "link", "set", host.interface, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getitem__(self, k: int) -> Host:
        return self.hosts[k]

    def __len__(self) -> int:
        return len(self.hosts)

    def set_link(self, up: bool) -> None:
        """Takes both ends of the link down (a pulled cable) or up again."""
        for host in self.hosts:
            _ip("-n", host.namespace, "link", "set", host.interface, "up" if up else "down")

    def close(self) -> None:
        """Removes the namespaces (their interfaces go with them); idempotent."""
        for host in self.hosts:
            _ip("netns", "del", host.namespace, check=False)
