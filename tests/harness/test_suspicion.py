"""Suspicion bookkeeping against a scripted detector and a fake clock: what is written once,
and when a silent member is left out."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.job.detector import Straggler
from harness.job.suspicion import Exclusion, Suspicions
from runfolder.events import EventRecorder
from tests.harness.test_runner import FakeClock, FakeDetector

MEMBERS = (0, 1, 2, 3)


def book(tmp_path: Path) -> tuple[Suspicions, FakeDetector, FakeClock]:
    clock = FakeClock()
    detector = FakeDetector(clock)
    recorder = EventRecorder(tmp_path / "events.jsonl", "rank", 0)
    return Suspicions(detector, recorder, clock, straggler_after=2.0, exclude_after=1.0), detector, clock


def written(tmp_path: Path, kind: str) -> list[dict]:
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


def test_a_suspect_is_written_once_per_generation_peer_and_cause(tmp_path):
    suspicions, detector, clock = book(tmp_path)
    assert suspicions.watch(0, MEMBERS, step=4, waited_s=0.1) is None
    detector.gone.add(2)
    for waited in (0.2, 0.3, 0.4):
        assert suspicions.watch(0, MEMBERS, step=4, waited_s=waited) == "rank 2 is gone (its heartbeat lease closed)"
    suspicions.watch(1, MEMBERS, step=4, waited_s=0.5)  # a new generation: said again
    detector.gone.clear()
    detector.silent_from[2] = clock.t - 0.9
    suspicions.watch(1, MEMBERS, step=4, waited_s=0.6)  # another cause: said again
    got = [(e["gen"], e["peer"], e["via"], e["cause"], e["waited_s"]) for e in written(tmp_path, "suspect")]
    assert got == [(0, 2, "connection", "connection", 0.2), (1, 2, "connection", "connection", 0.5),
                   (1, 2, "heartbeat", "heartbeat", 0.6)]


def test_stragglers_are_written_once_per_step_after_straggler_after(tmp_path):
    suspicions, detector, _ = book(tmp_path)
    detector.degraded = [Straggler(3, 0.2, 0.3)]
    assert suspicions.watch(0, MEMBERS, step=7, waited_s=1.9) is None
    assert written(tmp_path, "straggler") == []
    for waited in (2.0, 2.5):
        assert suspicions.watch(0, MEMBERS, step=7, waited_s=waited) is None
    detector.degraded = []
    suspicions.watch(0, MEMBERS, step=8, waited_s=2.1)  # slow with nobody degraded: peer null
    got = [(e["peer"], e["loss"], e["silent_s"], e["waited_s"], e["step"]) for e in written(tmp_path, "straggler")]
    assert got == [(3, 0.2, 0.3, 2.0, 7), (None, None, None, 2.1, 8)]


def test_a_rank_whose_process_is_gone_is_excluded_at_once(tmp_path):
    suspicions, detector, _ = book(tmp_path)
    detector.gone.add(1)
    exclusion = suspicions.exclusion(MEMBERS)
    assert exclusion.settled and exclusion.peers == [1]
    assert [s.via for s in exclusion.gone] == ["connection"]


def test_only_a_gone_or_silent_member_is_excluded(tmp_path):
    suspicions, detector, _ = book(tmp_path)
    detector.cut_off = True  # this rank's own suspicion: its health check's business
    assert suspicions.exclusion(MEMBERS) == Exclusion((), True)


def test_a_silent_rank_is_excluded_once_suspect_for_exclude_after(tmp_path):
    suspicions, detector, clock = book(tmp_path)
    detector.silent_from[2] = clock.t
    clock.sleep(0.85)
    assert suspicions.watch(0, MEMBERS, step=1, waited_s=0.85) is not None  # suspect from now
    clock.sleep(0.9)
    waiting = suspicions.exclusion(MEMBERS)
    assert not waiting.settled and waiting.peers == [2]
    clock.sleep(0.15)
    assert suspicions.exclusion(MEMBERS).settled


def test_a_rank_that_speaks_again_starts_a_new_grace_when_silent_again(tmp_path):
    suspicions, detector, clock = book(tmp_path)
    detector.silent_from[2] = clock.t - 0.85
    assert not suspicions.exclusion(MEMBERS).settled  # suspect from now
    del detector.silent_from[2]
    clock.sleep(0.5)
    spoke = suspicions.exclusion(MEMBERS)
    assert spoke.settled and spoke.peers == []
    detector.silent_from[2] = clock.t - 0.85
    assert not suspicions.exclusion(MEMBERS).settled  # suspect again, 0.5 s after the first time
    clock.sleep(0.6)  # 1.1 s after the first suspicion, 0.6 s into the second
    assert not suspicions.exclusion(MEMBERS).settled
    clock.sleep(0.4)
    assert suspicions.exclusion(MEMBERS).settled


def test_a_new_generation_forgets_when_members_were_first_suspected(tmp_path):
    suspicions, detector, clock = book(tmp_path)
    detector.silent_from[2] = clock.t - 0.85
    suspicions.exclusion(MEMBERS)
    clock.sleep(1.1)  # past its grace: left out, were it not for the new generation
    suspicions.generation_formed()
    assert not suspicions.exclusion(MEMBERS).settled  # the grace starts again
    clock.sleep(1.05)
    assert suspicions.exclusion(MEMBERS).settled


def test_each_new_request_to_rejoin_is_told_once_and_a_new_generation_has_answered_those_before(tmp_path):
    suspicions, detector, clock = book(tmp_path)
    assert not suspicions.rejoin_asked()
    detector.asks_at = [clock.t, clock.t]  # two ranks asked in one digest
    assert suspicions.rejoin_asked() and not suspicions.rejoin_asked()
    detector.asks_at.append(clock.t)
    suspicions.generation_formed()  # the generation that let them in
    assert not suspicions.rejoin_asked()
    detector.asks_at.append(clock.t)
    assert suspicions.rejoin_asked()


@pytest.mark.parametrize("cut_off", [True, False])
def test_cut_off_is_this_ranks_suspicion_of_itself(tmp_path, cut_off):
    suspicions, detector, _ = book(tmp_path)
    detector.gone.add(1)  # a peer gone is not this rank cut off
    detector.cut_off = cut_off
    found = suspicions.cut_off(0)
    assert (found is not None) is cut_off
    if cut_off:
        assert (found.peer, found.via) == (0, "cut-off")
