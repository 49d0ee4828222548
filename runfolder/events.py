"""The event recorder: flat JSON lines, one `os.write` per event, into the run folder.

Every process of a trial (the harness and each rank) appends to the same
``events.jsonl`` with O_APPEND, so lines never interleave and a rank that dies leaves
everything it wrote. Times are ``time.monotonic()``: one clock domain for all processes
that share a kernel (the run metadata records the wall-clock anchor).

Every event has: t (monotonic seconds), src ("rank" | "harness"), rank (int, or null for
the harness), pid, kind, and the fields of its kind:

  rank events
    rank_start          policy, world
    rendezvous          gen, arrived, world              waiting for the others (every 5 s)
    group_ready         gen, world, group_rank, secs     a process group is formed
    membership          gen, world, members, left_out, joined
                                                         the agreed members changed (original
                                                         rank ids, in group-rank order)
    restored            step, gen, source[, peer, bytes] state loaded: source checkpoint (the
                                                         newest all have) | peer (in-memory
                                                         state sent by original rank `peer`)
    step                step, gen, loss, dur             a training step completed
    checkpoint          step                             written atomically (group rank 0)
    suspect             peer, via, cause, silent_s, gen, waited_s
                                                         the failure detector suspects `peer`
                                                         (via = cause: connection: its process
                                                         is gone | heartbeat: silent for
                                                         silent_s | cut-off: this rank hears
                                                         no digest (peer = itself) |
                                                         generation: the peer moved on);
                                                         once per (gen, peer, via)
    straggler           peer, loss, silent_s, waited_s, gen, step
                                                         a collective pending waited_s with
                                                         every member alive; peer: one whose
                                                         heartbeats arrive degraded (null
                                                         when none does)
    collective_error    step, gen, phase, cause, error   phase: step | join; cause: timeout |
                                                         closed | reset | rendezvous |
                                                         suspect (the detector ended the
                                                         wait) | other
    group_released      secs                             the failed group let go (its stuck
                                                         op, if any, left to a reaper)
    group_reaped        gen, secs                        an abandoned group's threads ended and
                                                         its sockets closed (at its timeout)
    backoff             attempt, seconds                 sleeping before retry `attempt`
    health_check        attempt, ok, detail
    exclude             peers, gen, reasons              elastic: these members are left out
                                                         of the next proposal
    retry               attempt, after_gen               re-joining after generation after_gen
    breaker_open        reason
    rejoin_request      gen                              rejoin: breaker open, this rank hears
                                                         the control plane again and asks to
                                                         be let back in (gen: its last)
    rejoin_admitted     gen, waited_s                    generation gen includes it (waited_s
                                                         since its breaker opened); it joins
    rejoin_failed       error                            the store failed while it asked or
                                                         waited: it asks again once heard
    rejoin_gave_up      waited_s                         nobody let it in within rejoin_within:
                                                         it leaves (exit isolated)
    admit               peers, gen                       group rank 0 agreed generation gen with
                                                         these ranks let back in; every member
                                                         moves there after the same step
    resources_released  outcome, group, cuda_reserved_before, cuda_reserved_after,
                        cuda_free_before, cuda_free_after   (torch.cuda.mem_get_info; null
                                                         without CUDA)
    exit                reason, code[, error]            reason: stopped | failed-fast |
                                                         retries-exhausted | isolated |
                                                         terminated | crashed
  harness events
    trial_start         policy, ranks, run_id, backend, hang_cap
    cluster_up          secs
    rank_spawned        rank (field), pid
    ranks_ready         secs
    warmup_done         step
    fault_applied       index, fault_kind, fault, targets, mechanism, t_requested
                                                     t = kernel acknowledgement
    fault_reverted      index, fault_kind, targets[, teardown]    t = kernel acknowledgement
    rank_exited         rank (field), pid, exitcode, signal
    hang_detected       cap, idle_since              no step and no policy action for `cap`
    trial_end           reason
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"


class EventRecorder:
    def __init__(self, path: Path | str, source: str, rank: int | None = None) -> None:
        self.path = Path(path)
        self.source = source
        self.rank = rank
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(self, kind: str, t: float | None = None, **fields: Any) -> float:
        """Write one event now (or at the given monotonic time); returns its time."""
        t = time.monotonic() if t is None else t
        record = {"t": round(t, 6), "src": self.source, "rank": self.rank, "pid": os.getpid(),
                  "kind": kind, **fields}
        os.write(self._fd, (json.dumps(record, default=str) + "\n").encode())
        return t

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_events(path: Path | str, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Complete lines from byte `offset` on; returns them and the offset after the last one."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a SIGKILL mid-write
    return events, offset + end
