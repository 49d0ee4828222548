"""Fault values: parsing, validation messages (field, value, accepted form), composition
rules and mechanism choice, with no root and no kernel."""
from __future__ import annotations

import errno
import json

import pytest
from pydantic import ValidationError

from chaos.errors import InvalidFault
from chaos.faults import (FAULT_KINDS, Delay, IoDelay, IoError, IoStall, LoseUnsynced, Loss, Partition, kind_names,
                          parse_fault)
from chaos.fusefs import fault_from_json
from chaos.inject import choose_mechanisms
from chaos.probe import Capabilities


@pytest.mark.parametrize("data, field, value, form", [
    ({"kind": "loss", "percent": "120%"}, "loss.percent", "'120%'", "a percentage such as"),
    ({"kind": "delay", "latency": "-5ms"}, "delay.latency", "'-5ms'", "a duration such as"),
    ({"kind": "bandwidth", "rate": "10kbps"}, "bandwidth.rate", "'10kbps'", '"10kbit"'),
    ({"kind": "delay", "jitter": "5ms"}, "delay: latency", "0ms", "a duration such as"),
    ({"kind": "teleport"}, "kind", "'teleport'", "expected one of link_down, loss, delay"),
    ({"kind": "loss", "percent": 0.2}, "loss.percent", "0.2", "a percentage such as"),
    ({"kind": "loss", "percent": "20%", "rate": "1mbit"}, "loss.rate", "'1mbit'", "unknown field"),
    ({"kind": "partition", "groups": [[0, 1], [1]]}, "partition: groups", "host 1", "two groups"),
    ({"kind": "delay", "latency": "5ms", "jitter": "10ms"}, "delay: jitter", "10ms", "exceeds"),
    ({"kind": "preempt", "lead": "30s"}, "preempt: lead", "signal", "give both or neither"),
])
def test_invalid_parameters_are_refused_with_field_value_and_form(data, field, value, form):
    with pytest.raises(InvalidFault) as refused:
        parse_fault(data)
    message = str(refused.value)
    assert message.startswith(field) and value in message and form in message, message


def test_every_kind_parses_from_its_scenario_form():
    examples = {
        "link_down": {}, "loss": {"percent": "20%", "correlation": "25%"},
        "delay": {"latency": "50ms", "jitter": "5ms", "distribution": "normal"},
        "bandwidth": {"rate": "10mbit", "burst": "32kb"}, "duplicate": {"percent": "1%"},
        "corrupt": {"percent": "0.1%"}, "reorder": {"percent": "25%", "latency": "10ms"},
        "blackhole": {"direction": "to_host"}, "partition": {"groups": [["r000"], [1, 2]]},
        "kill": {"signal": "TERM"}, "pause": {}, "slow": {"cpu_percent": "25%", "period": "50ms"},
        "gpu_hang": {"duration": "10s"}, "step_delay": {"delay": "200ms"},
        "preempt": {"signal": "USR1", "lead": "30s", "requeue": True}, "requeue": {}, "node_down": {},
        "drain": {}, "slurmd_kill": {},
        "disk_full": {"after_bytes": "1mib"}, "read_only": {},
        "io_error": {"errno": "EIO", "ops": ["write", "fsync"], "percent": "20%"},
        "io_delay": {"latency": "50ms", "path": "step-*"}, "io_stall": {"ops": ["fsync"]},
        "lose_unsynced": {"path": "step-*.pt"},
    }
    assert set(examples) == set(kind_names()) == {c.model_fields["kind"].default for c in FAULT_KINDS}
    for kind, params in examples.items():
        fault = parse_fault({"kind": kind, **params})
        assert fault.kind == kind and fault == parse_fault({"kind": kind, **params})
    delay = parse_fault({"kind": "delay", "latency": "50ms", "jitter": "5ms"})
    assert isinstance(delay, Delay) and (delay.latency, delay.jitter) == (0.05, 0.005)
    with pytest.raises(ValidationError, match="frozen"):
        delay.latency = 1.0


def test_loss_memory_models_are_exclusive():
    assert parse_fault({"kind": "loss", "percent": "5%", "burst": 3}) == Loss(percent="5%", burst=3)
    with pytest.raises(InvalidFault, match="correlation and burst"):
        parse_fault({"kind": "loss", "percent": "5%", "burst": 3, "correlation": "10%"})


def test_disruptive_faults_carry_a_dead_man_switch():
    assert {c.model_fields["kind"].default for c in FAULT_KINDS if c.dead_man} == {
        "link_down", "blackhole", "partition"}
    assert Partition(groups=[[0], [1]]).direction == "both"


def _caps(**overrides) -> Capabilities:
    base = dict(netem=False, tbf=True, blackhole=True, clsact_bpf=True, nft_bridge=True,
                nfqueue_delay=True, bridge_netfilter=True)
    return Capabilities(**{**base, **overrides}, reasons={"clsact_bpf": "no bpf here"})


def test_mechanisms_prefer_netem_and_fall_back_without_it():
    with_netem = choose_mechanisms(_caps(netem=True))
    assert all(with_netem[k].name.startswith("netem") for k in ("loss", "delay", "duplicate", "corrupt", "reorder"))
    here = choose_mechanisms(_caps())
    assert "cls_bpf" in here["loss"].name and "NFQUEUE" in here["delay"].name
    assert "tbf" in here["bandwidth"].name and "nftables" in here["partition"].name
    for kind in ("duplicate", "corrupt", "reorder"):
        assert here[kind].name.startswith("unavailable: the kernel has no sch_netem")
    no_bpf = choose_mechanisms(_caps(clsact_bpf=False))  # an ordinary user's user namespace
    assert no_bpf["loss"].name.startswith("nftables drop") and no_bpf["blackhole"] is no_bpf["loss"]
    correlated = Loss(percent="20%", correlation="50%")
    assert "needs the BPF drop program" in no_bpf["loss"].conflict(correlated, None)
    assert no_bpf["loss"].conflict(Loss(percent="20%"), None) is None
    bare = choose_mechanisms(_caps(clsact_bpf=False, nft_bridge=False))
    assert bare["loss"].name == ("unavailable: the kernel has no sch_netem qdisc, no bpf here, and "
                                 "nft_bridge is not available")


def test_delayer_draws_keep_the_latency_at_the_median():
    import random
    import statistics

    from chaos.nfq import DelaySampler
    fixed = DelaySampler(0.05, 0.0, "uniform", 0.0)
    assert {fixed.draw() for _ in range(10)} == {0.05}
    for distribution, correlation in (("uniform", 0.25), ("normal", 0.25), ("paretonormal", 0.0)):
        sampler = DelaySampler(0.05, 0.01, distribution, correlation, random.Random(1))
        draws = [sampler.draw() for _ in range(20000)]
        assert statistics.fmean(draws) == pytest.approx(0.05, abs=0.0005)
        assert min(draws) >= 0.0
    uniform = DelaySampler(0.05, 0.01, "uniform", 0.0, random.Random(2))
    draws = [uniform.draw() for _ in range(5000)]
    assert 0.04 <= min(draws) and max(draws) <= 0.06


def test_every_kind_crosses_the_wire_to_a_node_agent_unchanged():
    """A harness sends a fault to a Slurm node's agent as its JSON dump; the agent gets the
    same value back (a percentage dumps as 0.2, which the scenario form would refuse)."""
    from chaos.faults import fault_from_wire
    for data in ({"kind": "loss", "percent": "20%", "correlation": "25%"}, {"kind": "blackhole", "direction": "to_host"},
                 {"kind": "link_down"}, {"kind": "kill", "signal": "TERM"}, {"kind": "pause"}, {"kind": "slurmd_kill"}):
        fault = parse_fault(data)
        assert fault_from_wire(json.loads(json.dumps(fault.model_dump(mode="json")))) == fault


def test_fuse_kinds_parse_and_refuse_with_the_field():
    assert parse_fault({"kind": "io_error", "errno": "enospc", "every_nth": 3}) == IoError(errno=errno.ENOSPC, every_nth=3)
    assert parse_fault({"kind": "io_delay", "latency": "50ms", "ops": ["fsync"]}) == IoDelay(latency=0.05, ops=("fsync",))
    assert IoStall().ops == ("write", "fsync") and parse_fault({"kind": "lose_unsynced"}) == LoseUnsynced()
    for bad, field in (({"kind": "io_error", "percent": "10%", "every_nth": 2}, "percent and every_nth"),
                       ({"kind": "io_error", "errno": "EWHAT"}, "io_error.errno"),
                       ({"kind": "io_error", "ops": ["chmod"]}, "io_error.ops.0"),
                       ({"kind": "io_delay"}, "io_delay.latency")):
        with pytest.raises(InvalidFault, match=field):
            parse_fault(bad)


@pytest.mark.parametrize("fault", [IoError(percent="30%", errno="ENOSPC", path="step-*"), IoDelay(latency="5ms"),
                                   IoStall(ops=("fsync",)), LoseUnsynced(path=".tmp-*")])
def test_the_daemon_rebuilds_the_fault_the_harness_sent(fault):
    assert fault_from_json(fault.model_dump_json()) == fault
