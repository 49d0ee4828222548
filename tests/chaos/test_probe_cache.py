"""A dry run reads the last probe of this boot instead of probing (it must answer at once);
a probe from another boot or kernel is never trusted."""
from __future__ import annotations

import dataclasses
import json

import pytest

from chaos import probe
from chaos.probe import LAST_PROBE_FILE, Capabilities, last_probe


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("CHAOS_STATE_DIR", str(tmp_path))
    return tmp_path


def _store(state, caps: Capabilities, **kernel: str) -> None:
    (state / LAST_PROBE_FILE).write_text(json.dumps(
        {**probe._this_kernel(), **kernel, "capabilities": dataclasses.asdict(caps)}))


def test_the_last_probe_of_this_boot_is_read_back_whole(state):
    caps = Capabilities(tbf=True, blackhole=True, nft_families=("bridge", "netdev"),
                        reasons={"netem": "no sch_netem"}, seconds=0.3)
    _store(state, caps)
    assert last_probe() == caps


def test_a_probe_of_another_boot_or_kernel_is_not_used(state):
    _store(state, Capabilities(netem=True), boot_id="another-boot")
    assert last_probe() is None
    _store(state, Capabilities(netem=True), kernel="0.0.0-other")
    assert last_probe() is None


def test_no_probe_or_a_torn_file_means_probe_again(state):
    assert last_probe() is None
    (state / LAST_PROBE_FILE).write_text('{"boot_id": ')
    assert last_probe() is None
