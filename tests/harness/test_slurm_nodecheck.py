"""What a node lets its agent inject, from its effective capabilities and user (the logic;
tests/slurm/test_slurm_backend.py asks a real cluster's nodes through `chaos doctor`)."""
from harness.cluster.slurm.nodecheck import CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN, allowed


def test_root_may_inject_every_kind_on_its_node():
    assert set(allowed(1 << CAP_NET_ADMIN | 1 << CAP_SYS_ADMIN, 0).values()) == {"yes"}


def test_an_ordinary_user_without_capabilities_may_signal_its_ranks_only():
    kinds = allowed(0, 1000)
    assert [k for k, v in kinds.items() if v == "yes"] == ["kill", "pause"]
    assert "CAP_NET_ADMIN" in kinds["link_down"] and "CAP_NET_ADMIN" in kinds["loss"]
    assert kinds["slurmd_kill"] == "the agent runs as uid 1000; slurmd runs as root"


def test_link_kinds_need_bpf_besides_net_admin():
    # link_down too: a lost carrier is the BPF drop both ways on the node's interface
    kinds = allowed(1 << CAP_NET_ADMIN, 1000)
    assert all("CAP_BPF" in kinds[k] for k in ("link_down", "blackhole", "loss"))
    assert allowed(1 << CAP_NET_ADMIN | 1 << CAP_BPF, 1000)["blackhole"] == "yes"
