"""Each host's own net.* settings (`chaos.sysctl`, a scenario's cluster.sysctls): written in
its namespace before its link is up, never in the machine's own, refused with the field and
the fix when the kernel has no such setting or will not take the value."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from chaos import sysctl, topology
from chaos.errors import UsageError
from chaos.heal import heal_run
from chaos.undotable import HealReport
from chaos.undo import UNDOS
from chaos.ledger import Ledger

from .conftest import new_run_id, run_leftovers

RETRANS = "net.ipv4.neigh.eth0.retrans_time_ms"
RETRIES = "net.ipv4.tcp_retries2"


def test_only_network_settings_are_a_hosts_own() -> None:
    assert sysctl.check_key(RETRANS) == RETRANS
    for key in ("kernel.pid_max", "vm.swappiness", "net", "net..ipv4", "net.ipv4/../../x", "net.ipv4.a b"):
        with pytest.raises(ValueError, match="only net.. settings are its own"):
            sysctl.check_key(key)
    assert sysctl.path_of(RETRANS) == Path("/proc/sys/net/ipv4/neigh/eth0/retrans_time_ms")


def build(settings: dict[str, str], hosts: int = 2):
    run_id = new_run_id()
    ledger = Ledger(run_id)
    layout = topology.hosts_of(run_id, hosts)
    return run_id, layout, lambda: topology.build(ledger, layout, settings)


def healed(run_id: str) -> None:
    heal_run(run_id, HealReport(), UNDOS)
    assert run_leftovers(run_id) == ([], []), "the test left namespaces or helper processes"


@pytest.mark.requires_root
def test_every_host_has_its_settings_and_the_machine_keeps_its_own(state_dir) -> None:
    machine = {key: sysctl.path_of(key).read_text().strip()
               for key in (RETRIES, "net.ipv4.neigh.default.retrans_time_ms")}
    run_id, hosts, up = build({RETRANS: "100", RETRIES: "5"})
    try:
        up()
        for h in hosts:
            assert sysctl.read(h.ns_path, [RETRANS, RETRIES]) == {RETRANS: "100", RETRIES: "5"}
        assert sysctl.read(f"/run/netns/{hosts[0].switch_ns}", [RETRIES]) == {RETRIES: machine[RETRIES]}
        assert {key: sysctl.path_of(key).read_text().strip() for key in machine} == machine
    finally:
        healed(run_id)


@pytest.mark.requires_root
@pytest.mark.parametrize(("settings", "says"), [
    ({"net.ipv4.neigh.eth9.retrans_time_ms": "100"},
     "cluster.sysctls: net.ipv4.neigh.eth9.retrans_time_ms: a host's network namespace has no such setting"),
    ({RETRIES: "often"}, "cluster.sysctls: net.ipv4.tcp_retries2: the kernel refused 'often' .Invalid argument.; "
                         "give a value that `sysctl -w net.ipv4.tcp_retries2=...` accepts"),
])
def test_a_setting_the_kernel_will_not_take_is_refused_with_the_fix(state_dir, settings, says) -> None:
    run_id, _, up = build(settings)
    try:
        with pytest.raises(UsageError, match=says):
            up()
    finally:
        healed(run_id)


@pytest.mark.requires_root
def test_the_link_return_bench_sees_traffic_through_again_after_a_link_down(state_dir, monkeypatch) -> None:
    """bench/link_return.py end to end, once: a host with its own ARP retransmission time,
    its link down and back, its datagrams through again (the bench prints how soon)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    link_return = importlib.import_module("link_return")
    [back_after] = link_return.first_through_after_return(0.1, [0.5])
    assert 0 <= back_after < link_return.AFTER_S
