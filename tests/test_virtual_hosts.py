"""The multi-node harness itself (lsm_gnn/testing/virtual_hosts.py): hosts reach each other over their link, the relay
delays and drops what it is told to, and the rsh agent runs a command on the host it names."""
import subprocess

import pytest

from lsm_gnn.testing.virtual_hosts import INTERFACE, VirtualHosts, relay_unavailable, round_trip_ms, unavailable

WHY_NOT = unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"no namespaced hosts: {WHY_NOT}")
needs_relay = pytest.mark.skipif(relay_unavailable() is not None, reason=f"no delaying link: {relay_unavailable()}")


def test_bad_link_settings_are_refused():
    with pytest.raises(ValueError, match="exactly 2 hosts"):
        VirtualHosts(3)
    with pytest.raises(ValueError, match="delay_ms"):
        VirtualHosts(delay_ms=-1)
    with pytest.raises(ValueError, match="loss"):
        VirtualHosts(loss=1.0)


@needs_relay
def test_the_relay_adds_its_delay_to_the_round_trip_and_drops_its_share():
    fast, slow = VirtualHosts(delay_ms=0.0), VirtualHosts(delay_ms=5.0, loss=0.1, seed=1)
    with fast as hosts:
        base = round_trip_ms(hosts, samples=20)
    with slow as hosts:
        delayed = round_trip_ms(hosts, samples=20)
    assert base < 5.0
    assert delayed >= 10.0  # 5 ms each way; TCP resends the dropped packets, so no sample is faster
    counts = slow.relay_counts
    assert 0.02 < counts["dropped"] / counts["packets"] < 0.3, counts


def test_the_rsh_agent_runs_on_the_host_it_names(tmp_path):
    with VirtualHosts() as hosts:
        agent = hosts.write_rsh_agent(tmp_path / "rsh")
        for host in hosts.hosts:
            shown = subprocess.run([agent, host.address, "ip", "-br", "addr", "show", INTERFACE],
                                   capture_output=True, text=True, timeout=30)
            assert shown.returncode == 0 and f"{host.address}/24" in shown.stdout, shown
        unknown = subprocess.run([agent, "10.0.0.99", "true"], capture_output=True, text=True, timeout=30)
        assert unknown.returncode == 255 and "no namespaced host 10.0.0.99" in unknown.stderr
