"""What a trial on a cluster did, as the harness's events: pure functions over what the
Kubernetes API returns (pods, their logs with the kubelet's timestamps, Chaos Mesh objects).

Clock domains. A rank's events carry `time.monotonic()` of its node. Every line of a pod's
log carries the wall clock of that node when the container runtime read it, a little
after the rank wrote it, so min(log time - t) over a node's lines places that node's
monotonic clock on its wall clock. Fault times come from Chaos Mesh's status records:
the chaos controller's wall clock, in whole seconds. A pod's end (finishedAt) is the
kubelet's, in whole seconds. Event times in the run folder are seconds after `anchor` (a
wall-clock second), so figures within a rank are exact, figures across nodes are as close
as the nodes' clocks are (NTP), and figures from a fault's start carry its 1 s resolution.

The end of a trial is judged as the orchestrator judges it live (harness.trial.orchestrator):
every rank exited; or every live rank made `settle_steps` steps after the last fault
action; or no rank event for the hang cap (hung); or past the deadline. Rank events after
that end are dropped: under the harness the ranks would have been stopped there.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from chaos.errors import HarnessError
from harness.k8s.faults import CHAOS_PLURALS, TEMPLATE
from harness.trial.plan import trial_deadline_s
from runfolder import events as kinds
from runfolder.plan import APPLY, REVERT, TrialPlan

APPLIED, RECOVERED, SUCCEEDED = "Apply", "Recover", "Succeeded"
CONTROLLED_BY = "chaos-mesh.org/controlled-by"  # on a chaos object: its workflow node, "<template>-<5>"


def wall_seconds(stamp: str | datetime) -> float:
    """Unix seconds of an RFC 3339 time (a log line's, nanoseconds cut to microseconds) or of
    a datetime the client parsed."""
    if isinstance(stamp, datetime):
        return stamp.timestamp()
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    base = datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp()
    return base + (float(f"0.{fraction}") if fraction else 0.0)


@dataclass(frozen=True)
class RankPod:
    """A rank's pod as the collector saw it."""

    rank: int
    name: str
    node: str
    log: str                                # read with timestamps=True ("" before it started)
    exit_code: int | None = None            # the rank container's, once terminated
    finished: float | None = None           # its finishedAt, wall seconds


@dataclass(frozen=True)
class Phase:
    """One on-phase of a fault as Chaos Mesh ran it (wall seconds)."""

    index: int
    phase: int
    objects: tuple[str, ...]
    requested: float                        # the first object's creation
    applied: float | None                   # every record applied (None: not yet)
    reverted: float | None                  # every record recovered (None: not yet, or never)


def rank_lines(log: str) -> list[tuple[float, dict[str, Any]]]:
    """(log time, event) of every rank event among a pod's log lines."""
    found = []
    for line in log.splitlines():
        stamp, _, text = line.partition(" ")
        if not text.startswith("{"):
            continue
        try:
            event = json.loads(text)
        except json.JSONDecodeError:
            continue  # a line torn by a SIGKILL mid-write
        if isinstance(event, dict) and event.get("src") == kinds.RANK and isinstance(event.get("t"), (int, float)):
            found.append((wall_seconds(stamp), event))
    return found


def node_offsets(lines: dict[int, list[tuple[float, dict[str, Any]]]], node_of: dict[int, str]) -> dict[str, float]:
    """Per node: wall clock minus monotonic clock, the least lag over its ranks' lines."""
    offsets: dict[str, float] = {}
    for rank, found in lines.items():
        for stamp, event in found:
            node = node_of[rank]
            offsets[node] = min(offsets.get(node, math.inf), stamp - event["t"])
    return offsets


def _records(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return ((obj.get("status") or {}).get("experiment") or {}).get("containerRecords") or []


def _succeeded_at(record: dict[str, Any], operation: str, latest: bool = False) -> float | None:
    """When a record's `operation` first (or last) succeeded; None if it never did."""
    times = [wall_seconds(e["timestamp"]) for e in record.get("events") or []
             if e.get("operation") == operation and e.get("type") == SUCCEEDED]
    return (max(times) if latest else min(times)) if times else None


def chaos_failures(objects: dict[str, dict[str, Any]]) -> list[str]:
    """Each apply or recover Chaos Mesh failed at and has not done since, in words (it retries)."""
    return [f"{obj['kind']} {name}: {e.get('operation')} on {r.get('id')} failed: {e.get('message', '')}"
            for name, obj in sorted(objects.items()) for r in _records(obj) for e in r.get("events") or []
            if e.get("type") != SUCCEEDED and _succeeded_at(r, e.get("operation", "")) is None]


def phases(objects: dict[str, dict[str, Any]]) -> list[Phase]:
    """The on-phases of the Workflow's chaos objects, from their template names."""
    grouped: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for obj in objects.values():
        node = (obj["metadata"].get("labels") or {}).get(CONTROLLED_BY, "")
        match = TEMPLATE.match(node.rpartition("-")[0])
        if match and obj.get("kind") in CHAOS_PLURALS:
            grouped.setdefault((int(match.group(1)), int(match.group(2))), []).append(obj)
    out = []
    for (index, phase), objs in sorted(grouped.items()):
        records = [r for obj in objs for r in _records(obj)]
        applies = [_succeeded_at(r, APPLIED) for r in records]
        recovers = [_succeeded_at(r, RECOVERED, latest=True) for r in records]
        applied = max(applies) if records and None not in applies else None  # type: ignore[type-var]
        reverted = max(recovers) if applied is not None and None not in recovers else None  # type: ignore[type-var]
        out.append(Phase(index, phase, tuple(sorted(o["metadata"]["name"] for o in objs)),
                         min(wall_seconds(o["metadata"]["creationTimestamp"]) for o in objs), applied, reverted))
    return out


@dataclass(frozen=True)
class Observed:
    """A trial on the cluster so far: its events (seconds after `anchor`) and whether it is over."""

    over: bool
    status: str                             # what it is doing, in words
    events: list[dict[str, Any]] = field(default_factory=list)
    anchor: float = 0.0                     # the wall-clock second the events' t count from
    nodes: dict[int, str] = field(default_factory=dict)


def observe(plan: TrialPlan, pods: dict[int, RankPod], objects: dict[str, dict[str, Any]], now: float,
            job: str, backend: str, mechanism: str, pid: int) -> Observed:
    """The trial's events in one clock (as far as the clocks allow) and its state."""
    if len(pods) < plan.ranks:
        return Observed(False, f"waiting for the rank pods: {len(pods)} of {plan.ranks} exist")
    lines = {r: rank_lines(p.log) for r, p in pods.items()}
    node_of = {r: p.node for r, p in pods.items()}
    offsets = node_offsets(lines, node_of)
    if not all(lines.values()):
        return Observed(False, f"waiting for the ranks to start: {sum(map(bool, lines.values()))} of "
                               f"{plan.ranks} logged an event")
    ranked = sorted(((event["t"] + offsets[node_of[r]], event) for r, found in lines.items()
                     for _, event in found), key=lambda te: te[0])
    steps: dict[int, list[float]] = {}
    for t, event in ranked:
        if event["kind"] == kinds.STEP:
            steps.setdefault(event["rank"], []).append(t)
    exits = {r: max(p.finished, max(t for t, e in ranked if e["rank"] == r))
             for r, p in pods.items() if p.finished is not None}
    want = plan.warmup_steps
    if not all(len(steps.get(r, ())) >= want for r in range(plan.ranks)):
        if exits:
            raise HarnessError(f"rank(s) {sorted(exits)} exited during warm-up; see their pods' logs")
        made = sum(len(steps.get(r, ())) >= want for r in range(plan.ranks))
        return Observed(False, f"warm-up: {made} of {plan.ranks} ranks made {want} steps")
    warm = max(steps[r][want - 1] for r in range(plan.ranks))
    ran = phases(objects)
    failures = chaos_failures(objects)
    if failures:
        raise HarnessError("Chaos Mesh could not inject the trial's faults: " + "; ".join(failures))
    actions = sorted([(p.applied, APPLY, p) for p in ran if p.applied is not None]
                     + [(p.reverted, REVERT, p) for p in ran if p.reverted is not None], key=lambda a: a[0])
    end = _end(plan, steps, [t for t, _ in ranked], exits, [a[0] for a in actions], warm, now)
    if end is None:
        done = len(actions)
        status = (f"warm ({want} steps on every rank): apply faults.yaml now" if plan.actions and not ran else
                  f"faults: {done} of {len(plan.actions)} actions done" if done < len(plan.actions) else
                  f"settling: waiting for {plan.settle_steps} steps on every live rank after the last action")
        return Observed(False, status)
    anchor = math.floor(ranked[0][0])
    events = _trial_events(plan, ranked, anchor, warm, actions, exits, pods, end, job, backend, mechanism, pid)
    return Observed(True, f"over: {end[1]}", events, anchor, node_of)


def _trial_events(plan: TrialPlan, ranked: list[tuple[float, dict[str, Any]]], anchor: float, warm: float,
                  actions: list[tuple[float, str, Phase]], exits: dict[int, float], pods: dict[int, RankPod],
                  end: tuple[float, str, float], job: str, backend: str, mechanism: str,
                  pid: int) -> list[dict[str, Any]]:
    """The rank events until the end and the harness's events of the trial, in seconds after
    `anchor` (wall clock)."""
    t_end, reason, idle_since = end
    harness = _HarnessEvents(anchor, pid)
    harness.emit(kinds.TRIAL_START, ranked[0][0], policy=plan.policy, ranks=plan.ranks, run_id=job,
                 backend=backend, hang_cap=plan.hang_cap)
    reached = {e["rank"]: e["step"] for t, e in ranked if e["kind"] == kinds.STEP and t <= warm}
    harness.emit(kinds.WARMUP_DONE, warm, step=min(reached.values()))
    for t, verb, p in actions:
        planned = plan.faults[p.index]
        if t > t_end:
            continue
        if verb == APPLY:
            harness.emit(kinds.FAULT_APPLIED, t, t_requested=round(p.requested - anchor, 6), index=p.index,
                         fault_kind=planned.kind, fault=planned.fault, targets=list(planned.targets),
                         mechanism=f"{mechanism}: {', '.join(p.objects)}")
        else:
            harness.emit(kinds.FAULT_REVERTED, t, index=p.index, fault_kind=planned.kind,
                         targets=list(planned.targets))
    pids = {e["rank"]: e["pid"] for _, e in ranked}
    for rank, t in sorted(exits.items()):
        code = pods[rank].exit_code or 0
        if t <= t_end:
            killed = 128 < code <= 128 + 64  # the runtime reports death by signal N as 128 + N
            harness.emit(kinds.RANK_EXITED, t, rank=rank, pid=pids[rank], exitcode=None if killed else code,
                         signal=code - 128 if killed else None)
    if reason == "hung":
        harness.emit(kinds.HANG_DETECTED, t_end, cap=plan.hang_cap, idle_since=round(idle_since - anchor, 6))
    harness.emit(kinds.TRIAL_END, t_end, reason=reason)
    ranks = [{**e, "t": round(t - anchor, 6)} for t, e in ranked if t <= t_end]
    return ranks + harness.events


class _HarnessEvents:
    """The harness's events of a trial on the cluster: written by the collector, one pid."""

    def __init__(self, anchor: float, pid: int) -> None:
        self.anchor, self.pid = anchor, pid
        self.events: list[dict[str, Any]] = []

    def emit(self, kind: str, t: float, rank: int | None = None, **fields: Any) -> None:
        self.events.append({"t": round(t - self.anchor, 6), "src": kinds.HARNESS, "rank": rank, "pid": self.pid,
                            "kind": kind, **fields})


def _end(plan: TrialPlan, steps: dict[int, list[float]], activity: list[float], exits: dict[int, float],
         actions: list[float], warm: float, now: float) -> tuple[float, str, float] | None:
    """(time, reason, idle since) of the first end rule that applies, or None: the
    orchestrator's rules, applied to what happened instead of while it happens."""
    ends: list[tuple[float, str, float]] = []
    if len(exits) == plan.ranks:
        ends.append((max(exits.values()), "all-exited", 0.0))
    if len(actions) == len(plan.actions):
        last = max(actions, default=warm)
        # a rank is settled from its settle_steps-th step after the last action, or its exit
        ready = [min(exits.get(r, math.inf), _nth_after(steps.get(r, []), last, plan.settle_steps))
                 for r in range(plan.ranks)]
        t = max(ready)
        if math.isfinite(t) and any(exits.get(r, math.inf) > t for r in range(plan.ranks)):
            ends.append((t, "settled", 0.0))
    idle_since = warm
    for t in [a for a in activity if a > warm] + [now]:
        if t - idle_since >= plan.hang_cap:
            ends.append((idle_since + plan.hang_cap, "hung", idle_since))
            break
        idle_since = max(idle_since, t)
    origin = actions[0] - plan.actions[0].at if actions else warm  # when the Workflow's timeline began
    deadline = origin + trial_deadline_s(plan)
    if now > deadline:
        ends.append((deadline, "deadline", 0.0))
    return min(ends) if ends else None


def _nth_after(times: list[float], after: float, n: int) -> float:
    later = [t for t in times if t > after]
    return later[n - 1] if len(later) >= n else math.inf
