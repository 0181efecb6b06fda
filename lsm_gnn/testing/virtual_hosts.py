"""Two "hosts" on one machine, for multi-node tests and benchmarks: network namespaces joined by one link.

Each host is a Linux network namespace with its own interface and address on a private /24, so a torchrun
agent, an mpirun daemon or any command started in it reaches the other host over that link and not over
loopback, as on two machines: rendezvous, gloo's collectives and the cache's exchange (its rows too:
``LSM_GNN_EXCHANGE=collective``) all cross it. The
interface has the same name on both hosts (:data:`INTERFACE`), as ``eth0`` has on a real cluster, so one
``GLOO_SOCKET_IFNAME`` serves every rank.

The link is a veth pair, or, given ``delay_ms`` or ``loss``, a relay process between two TUN devices that
holds each packet for the delay and drops a share of them: ``tc netem`` in user space, for kernels without
the netem qdisc (this project's machines have none). The relay adds its own few tens of microseconds;
:func:`round_trip_ms` and :func:`throughput_mbit_s` measure what a link really gives. Needs root and
iproute2; :func:`unavailable` says why not, for tests to skip with that reason.

    with VirtualHosts(delay_ms=1.0) as hosts:
        hosts[0].popen(["python", "-c", "..."])        # inside host 0's namespace
        hosts[1].address                               # e.g. "10.77.12.2"
        hosts.set_link(up=False)                       # both ends down: a pulled cable
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import queue
import random
import shutil
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from lsm_gnn.comm.shm import EXCHANGE_ENV

INTERFACE = "lsm-link"   # the link's name inside each host
RELAY_MTU = 65000        # large frames keep the relay's packet rate (its cost) low


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"'ip {' '.join(args)}' failed: {done.stderr.strip() or done.returncode}")
    return done


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


def relay_unavailable() -> str | None:
    """Why a delaying link cannot be made here (no /dev/net/tun), or None."""
    try:
        if not stat.S_ISCHR(os.stat("/dev/net/tun").st_mode):
            return "/dev/net/tun is not a character device"
    except OSError as exc:
        return f"no TUN device ({exc}); a delaying link needs /dev/net/tun"
    return None


@dataclass
class Host:
    """One namespaced host: its namespace and address (its interface is :data:`INTERFACE`)."""

    namespace: str
    address: str
    interface: str = INTERFACE

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def env(self, base: dict | None = None) -> dict:
        """Environment for a rank on this host: gloo binds to the host's link, not to loopback, and the shared
        cache's rows cross it too (unless ``base`` says otherwise): the namespaced hosts share this machine's
        /dev/shm, which two machines do not, and would pass the rows through it (docs/distributed.md)."""
        env = dict(os.environ if base is None else base)
        env["GLOO_SOCKET_IFNAME"] = self.interface
        env.setdefault(EXCHANGE_ENV, "collective")
        return env

    def popen(self, argv: list[str], env: dict | None = None, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), env=self.env(env), **kwargs)


class VirtualHosts:
    """Two namespaced hosts joined by one link; made on enter, removed on exit.

    ``delay_ms`` (one way, each direction) and ``loss`` (the share of packets dropped, each direction) make
    the link a user-space relay; ``delay_ms=0`` gives the relay with no added delay, the baseline to compare
    delays against. Names carry the process id, so concurrent runs do not collide; the subnet is
    10.77.<k>.0/24 with ``k`` from the process id.
    """

    def __init__(self, count: int = 2, delay_ms: float | None = None, loss: float = 0.0, seed: int = 0):
        if count != 2:
            raise ValueError(f"VirtualHosts joins exactly 2 hosts by one link, got {count}")
        if delay_ms is not None and delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {delay_ms}")
        if not 0.0 <= loss < 1.0:
            raise ValueError(f"loss is a share of packets in [0, 1), got {loss}")
        self.delay_ms = delay_ms if delay_ms is not None or loss == 0 else 0.0
        self.loss, self.seed = loss, seed
        self._tag = os.getpid() % 100_000
        subnet = 1 + os.getpid() % 250
        self.hosts = [Host(f"lsm-h{k}-{self._tag}", f"10.77.{subnet}.{k + 1}") for k in range(count)]
        self._relay: subprocess.Popen | None = None
        self.relay_counts: dict | None = None  # after close: packets the relay saw and dropped, both directions

    @property
    def relayed(self) -> bool:
        return self.delay_ms is not None

    def __enter__(self) -> VirtualHosts:
        reason = unavailable() or (relay_unavailable() if self.relayed else None)
        if reason is not None:
            raise RuntimeError(f"cannot make namespaced hosts: {reason}")
        ends = [f"lsm{k}-{self._tag}" for k in range(len(self.hosts))]  # unique names in the root namespace
        try:
            for host in self.hosts:
                _ip("netns", "add", host.namespace)
            if self.relayed:
                self._start_relay(ends)
            else:
                _ip("link", "add", ends[0], "type", "veth", "peer", "name", ends[1])
            for host, end in zip(self.hosts, ends):
                _ip("link", "set", end, "netns", host.namespace)
                _ip("-n", host.namespace, "link", "set", end, "name", host.interface)
                if self.relayed:
                    _ip("-n", host.namespace, "link", "set", host.interface, "mtu", str(RELAY_MTU))
                _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
                _ip("-n", host.namespace, "link", "set", "lo", "up")
                _ip("-n", host.namespace, "link", "set", host.interface, "up")
        except BaseException:
            self.close()
            raise
        return self

    def _start_relay(self, ends: list[str]) -> None:
        # Run as a script, not ``-m lsm_gnn...``: the package's imports (torch) would cost seconds a link.
        argv = [sys.executable, os.path.abspath(__file__), "relay", *ends, "--delay-ms", str(self.delay_ms),
                "--loss", str(self.loss), "--seed", str(self.seed)]
        # It imports lsm_gnn from the checkout this file is in, installed or not.
        package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_parent,
                                                                         os.environ.get("PYTHONPATH")])))
        # stdin is the relay's lifeline: it exits when this process closes the pipe (or dies).
        self._relay = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, env=env)
        line = self._relay.stdout.readline()
        if line.strip() != "ready":
            err = self._relay.stderr.read() if self._relay.poll() is not None else ""
            raise RuntimeError(f"the link relay did not start: {(line + err).strip()[-2000:]}")

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

    def write_rsh_agent(self, path: str | os.PathLike) -> str:
        """Writes an executable that stands in for ssh between the hosts: ``agent <address> <command...>`` runs
        the command in that host's namespace, as ``ssh`` runs it on that machine. For Open MPI's
        ``plm_rsh_agent``, so ``mpirun --host a,b`` starts its daemons on both hosts."""
        cases = "\n".join(f"  {h.address}) ns={h.namespace} ;;" for h in self.hosts)
        script = (f"#!/bin/sh\n# ssh for namespaced hosts (lsm_gnn/testing/virtual_hosts.py)\nhost=$1; shift\n"
                  f"case \"$host\" in\n{cases}\n  *) echo \"no namespaced host $host\" >&2; exit 255 ;;\nesac\n"
                  f"exec ip netns exec \"$ns\" /bin/sh -c \"$*\"\n")
        with open(path, "w") as fh:
            fh.write(script)
        os.chmod(path, 0o755)
        return str(path)

    def close(self) -> None:
        """Stops the relay and removes the namespaces (their interfaces go with them); idempotent."""
        if self._relay is not None:
            self._relay.stdin.close()
            try:
                last = self._relay.stdout.readline()
                self._relay.wait(timeout=10)
                self.relay_counts = json.loads(last) if last.strip() else None
            except subprocess.TimeoutExpired:
                self._relay.kill()
                self._relay.wait()
            self._relay.stdout.close()
            self._relay.stderr.close()
            self._relay = None
        for host in self.hosts:
            _ip("netns", "del", host.namespace, check=False)


def round_trip_ms(hosts: VirtualHosts, samples: int = 200, size: int = 64) -> float:
    """The median TCP round trip of ``size`` bytes between the two hosts, in milliseconds (no ping here)."""
    server = ("import socket,sys;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
              f"s.bind(('{hosts[1].address}',0));s.listen();print(s.getsockname()[1],flush=True);c,_=s.accept();"
              "c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\nwhile True:\n d=c.recv(65536)\n"
              " if not d: break\n c.sendall(d)")
    client = ("import socket,statistics,sys,time;s=socket.create_connection((sys.argv[1],int(sys.argv[2])));"
              f"s.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1);b=b'x'*{size};t=[]\n"
              f"for _ in range({samples}):\n t0=time.perf_counter();s.sendall(b);n=0\n"
              f" while n<{size}: n+=len(s.recv(65536))\n t.append(time.perf_counter()-t0)\n"
              "print(statistics.median(t)*1e3)")
    return float(_client_server(hosts, server, client, "round trip"))


def throughput_mbit_s(hosts: VirtualHosts, seconds: float = 2.0) -> float:
    """What the link carries one way, in Mbit/s: host 0 streams to host 1 over TCP for ``seconds``."""
    sink = ("import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
            f"s.bind(('{hosts[1].address}',0));s.listen();print(s.getsockname()[1],flush=True);c,_=s.accept()\n"
            "while c.recv(1<<20): pass")
    source = ("import socket,sys,time;s=socket.create_connection((sys.argv[1],int(sys.argv[2])));b=b'x'*(1<<20);"
              f"n=0;t=time.perf_counter()\nwhile time.perf_counter()-t<{seconds}: s.sendall(b);n+=len(b)\n"
              "s.shutdown(socket.SHUT_WR);print(n*8/1e6/(time.perf_counter()-t))")
    return float(_client_server(hosts, sink, source, "throughput"))


def _client_server(hosts: VirtualHosts, server: str, client: str, what: str) -> str:
    """Runs Python ``server`` on host 1 (it prints the port it listens on) and ``client`` on host 0 (given
    that address and port); the client's output."""
    proc = hosts[1].popen([sys.executable, "-c", server], stdout=subprocess.PIPE, text=True)
    try:
        port = proc.stdout.readline().strip()
        done = subprocess.run(hosts[0].command([sys.executable, "-c", client, hosts[1].address, port]),
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{what} failed: {done.stderr.strip()[-1000:]}")
        return done.stdout.strip()
    finally:
        proc.kill()
        proc.wait()


# -- the relay (a process of its own, so the caller's GIL does not delay packets) --------------------------------

_TUNSETIFF, _IFF_TUN, _IFF_NO_PI = 0x400454CA, 0x0001, 0x1000


def _open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    return fd


def _relay_direction(src: int, dst: int, delay_s: float, loss: float, rng: random.Random, counts: dict) -> None:
    """Moves packets src -> dst: a reader stamps each with its due time, a writer sends it then (FIFO: the
    delay is the same for every packet, as netem's without jitter)."""
    due: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        while True:
            packet = os.read(src, RELAY_MTU + 64)
            counts["packets"] += 1
            if loss and rng.random() < loss:
                counts["dropped"] += 1
                continue
            due.put((time.monotonic() + delay_s, packet))

    def write() -> None:
        while True:
            at, packet = due.get()
            wait = at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                os.write(dst, packet)
            except OSError:  # the far end is down (a test pulled the cable): the packet is lost, as on a wire
                pass

    for target in (read, write):
        threading.Thread(target=target, daemon=True).start()


def _relay_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python lsm_gnn/testing/virtual_hosts.py relay")
    parser.add_argument("ends", nargs=2, help="the two TUN devices to create and join")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    a, b = (_open_tun(name) for name in args.ends)
    counts = {"packets": 0, "dropped": 0}
    for k, (src, dst) in enumerate(((a, b), (b, a))):
        _relay_direction(src, dst, args.delay_ms / 1e3, args.loss, random.Random(args.seed * 2 + k), counts)
    print("ready", flush=True)
    sys.stdin.read()  # until the owner closes the pipe or dies; the TUN devices vanish with this process
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] != ["relay"]:
        sys.exit("usage: python lsm_gnn/testing/virtual_hosts.py relay END_A END_B [--delay-ms D] [--loss P]")
    _relay_main(sys.argv[2:])
