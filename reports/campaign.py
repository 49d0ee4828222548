"""A campaign's measures (`chaos campaign`, docs/campaign.md), from its run folders' events.

A policy's campaign is one or more trials (segments: a job the scheduler started again after
the last one ended) on one monotonic clock, inside a window that starts when the first
segment's warm-up is done. Every rank's `step` events give the step executions, one per
(segment, generation, step number), completed when the last rank finished it:

    kept execution    one no later execution rolls back past: no later execution has a step
                      number at or below its own (the steps the final model went through)
    step time         the time since the execution before it in the same stretch (same
                      segment and generation, the step before), at most the stretch's median
                      gap (the job's own pace); the first after a start or a restore takes
                      that median, at most the time since that start or restore. The rest
                      of a long gap is a stall: nothing moved
    ETTR              kept steps' time / wall time (wall: the window, `duration` from its start)
    goodput           kept steps per second of wall time; beside the fault-free reference's

What is not kept is lost, by cause: `recompute` (executions rolled back), and every stall
between executions (time no step was being made): `hang` (the cap a hung segment waited,
said as such), `detection` (the stall up to the first rank's detection in it), `restart`
(the rest of a stall with a detection or a segment's end in it: backoff, rendezvous,
restore, the next job's start), `other` (stalls with none of these: a step slowed by a
fault no rank detected, or by the machine).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from matplotlib.figure import Figure

from runfolder.events import (COLLECTIVE_ERROR, EVENTS_FILE, FAULT_APPLIED, HANG_DETECTED, JOB_OUTPUT, RESTORED,
                              STATE, STEP, SUSPECT, TRIAL_END, TRIAL_START, WARMUP_DONE, read_events)
from runfolder.info import RunFolderError
from runfolder.layout import CAMPAIGN_FILE, CAMPAIGN_FORMAT, trial_dirs

DETECTIONS = (COLLECTIVE_ERROR, SUSPECT, JOB_OUTPUT)
CAUSES = ("detection", "restart", "recompute", "hang", "other")
MIN_STRETCH = 5  # steps in a row whose median is a stretch's usual step time (fewer: the whole run's)


@dataclass(frozen=True)
class Execution:
    segment: int
    gen: int
    step: int
    t: float          # when its last rank finished it
    seconds: float = 0.0
    kept: bool = False
    ranks: int = 0    # how many ranks made it (an elastic job goes on smaller)


@dataclass(frozen=True)
class FaultCost:
    index: int            # in the campaign's schedule
    kind: str
    t: float              # applied, campaign time (s after the window's start)
    detect_s: float | None   # to the first rank's detection
    resume_s: float | None   # to the first step completed after it (any segment)
    hung: bool            # its segment reached the hang cap


@dataclass
class PolicyMeasures:
    wall_s: float
    kept_steps: int
    kept_s: float
    lost_s: dict[str, float]
    faults: list[FaultCost] = field(default_factory=list)
    segments: int = 1
    hangs: int = 0
    final_ranks: int = 0   # ranks that made the window's last step

    @property
    def ettr(self) -> float:
        return self.kept_s / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def goodput(self) -> float:
        """Kept steps per second of wall time."""
        return self.kept_steps / self.wall_s if self.wall_s > 0 else float("nan")


def executions(events: Iterable[dict[str, Any]], start: float, end: float) -> list[Execution]:
    """Step executions completed inside [start, end], in time order, with their step time and
    whether they were kept. Each event carries `segment` (its trial's place in the campaign)."""
    done: dict[tuple[int, int, int], float] = {}
    ranks: dict[tuple[int, int, int], set[int]] = {}
    began: dict[tuple[int, int | None], float] = {}  # a stretch's start: its last restore, else its trial's
    for ev in events:
        if ev["kind"] == TRIAL_START:
            began[(ev["segment"], None)] = ev["t"]
        elif ev["kind"] == RESTORED:
            began[(ev["segment"], ev["gen"])] = max(began.get((ev["segment"], ev["gen"]), ev["t"]), ev["t"])
        if ev["kind"] == STEP and ev.get("rank") is not None:
            key = (ev["segment"], ev["gen"], ev["step"])
            # every rank of an execution counts, the window's last one too: its ranks' steps
            # land a few ms apart and the window's end may fall between them
            ranks.setdefault(key, set()).add(ev["rank"])
            if start <= ev["t"] <= end:
                done[key] = max(done.get(key, ev["t"]), ev["t"])
    ordered = sorted(done.items(), key=lambda item: item[1])
    # kept: no later execution goes back to its step or below it
    kept, lowest_later = [], None
    for (_, _, step), _t in reversed(ordered):
        kept.append(lowest_later is None or step < lowest_later)
        lowest_later = step if lowest_later is None else min(lowest_later, step)
    kept.reverse()
    gaps: dict[int, float] = {}
    stretches: dict[tuple[int, int], list[float]] = {}
    for i, ((segment, gen, step), t) in enumerate(ordered):
        if i and ordered[i - 1][0] == (segment, gen, step - 1):
            gaps[i] = t - ordered[i - 1][1]
            stretches.setdefault((segment, gen), []).append(gaps[i])
    every = [g for gs in stretches.values() for g in gs]
    overall = statistics.median(every) if every else 0.0
    found = []
    for i, ((segment, gen, step), t) in enumerate(ordered):
        own = stretches.get((segment, gen), [])
        # a step's own time is at most its stretch's usual one: the rest of a long gap is a
        # stall (nothing moved), whatever ended it
        usual = statistics.median(own) if len(own) >= MIN_STRETCH else overall
        seconds = min(gaps.get(i, usual), usual)
        # a step's time never reaches back past the execution before it, nor, the first of a
        # stretch, past its stretch's start (a restarted job can make its first step sooner
        # after its start than a step takes)
        seconds = min(seconds, t - (ordered[i - 1][1] if i else start))
        if i not in gaps:
            begin = began.get((segment, gen), began.get((segment, None)))
            if begin is not None and begin < t:
                seconds = min(seconds, t - begin)
        found.append(Execution(segment, gen, step, t, seconds, kept[i], len(ranks[(segment, gen, step)])))
    return found


def measure(events: list[dict[str, Any]], start: float, end: float,
            schedule_of: dict[tuple[int, int], int] | None = None) -> PolicyMeasures:
    """A policy's measures over its window [start, end] (monotonic seconds). `schedule_of`
    maps (segment, fault index in that segment) to the fault's index in the schedule."""
    runs = executions(events, start, end)
    kept = [e for e in runs if e.kept]
    lost = dict.fromkeys(CAUSES, 0.0)
    lost["recompute"] = sum(e.seconds for e in runs if not e.kept)
    detections = sorted(ev["t"] for ev in events if ev["kind"] in DETECTIONS and ev.get("rank") is not None)
    hangs = [(ev["t"] - ev["cap"], ev["t"]) for ev in events if ev["kind"] == HANG_DETECTED]
    # a job that ended before the window did (a settled one trained to its end: no restart)
    ends = sorted(ev["t"] for ev in events if ev["kind"] == TRIAL_END and ev.get("reason") != "settled")
    marks = [start, *(e.t for e in runs), end]
    busy_until = [start, *(e.t - e.seconds for e in runs), end]  # each stall ends where a step's time begins
    for a, b in zip(marks[:-1], busy_until[1:], strict=True):
        if b <= a:
            continue
        hung = sum(max(0.0, min(b, h1) - max(a, h0)) for h0, h1 in hangs)
        first = next((d for d in detections if a < d <= b), None)
        detect = 0.0 if first is None else max(0.0, first - a - _overlap(a, first, hangs))
        restarting = first is not None or any(a < t <= b for t in ends)
        rest = max(0.0, (b - a) - hung - detect)
        lost["hang"] += hung
        lost["detection"] += detect
        lost["restart" if restarting else "other"] += rest
    faults = []
    applied = sorted(ev["t"] for ev in events if ev["kind"] == FAULT_APPLIED)
    for ev in events:
        if ev["kind"] != FAULT_APPLIED or not start <= ev["t"] <= end:
            continue
        t = ev["t"]
        next_fault = next((a for a in applied if a > t), float("inf"))
        first = next((d for d in detections if t <= d < next_fault), None)
        resumed = next((e.t for e in runs if e.t > (t if first is None else first)), None)
        hang_end = next((h1 for _, h1 in sorted(hangs, key=lambda h: h[1]) if h1 >= t), None)
        hung = hang_end is not None and (resumed is None or hang_end < resumed)
        index = (schedule_of or {}).get((ev["segment"], ev["index"]), ev["index"])
        faults.append(FaultCost(index, ev["fault_kind"], t - start, None if first is None else first - t,
                                None if resumed is None else resumed - t, hung))
    wall = end - start
    return PolicyMeasures(wall, len(kept), sum(e.seconds for e in kept), lost, faults,
                          segments=len({ev["segment"] for ev in events}), hangs=len(hangs),
                          final_ranks=runs[-1].ranks if runs else 0)


def _overlap(a: float, b: float, spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, s1) - max(a, s0)) for s0, s1 in spans)


def window_start(events: list[dict[str, Any]]) -> float | None:
    """When the campaign's window starts: the first segment's warm-up done."""
    return next((ev["t"] for ev in events if ev["kind"] == WARMUP_DONE and ev["segment"] == 0), None)


def kept_curve(events: list[dict[str, Any]], start: float, end: float) -> tuple[list[float], list[int]]:
    """Kept steps completed by each time (seconds after `start`): the picture's line. A
    kept execution counts once a later one has not undone it, so the line never falls."""
    kept = [e.t - start for e in executions(events, start, end) if e.kept]
    return [0.0, *kept, end - start], [0, *range(1, len(kept) + 1), len(kept)]


@dataclass(frozen=True)
class Projection:
    """ETTR on `nodes` nodes of per-node MTBF `node_mtbf_s`, from a policy's measured cost per
    fault (docs/campaign.md): a model, never a measurement."""

    cost_s: float          # c: seconds lost per fault, beyond the fault-free reference's loss
    job_mtbf_s: float      # M / N
    ettr: float            # e0 x max(0, 1 - c / (M / N))
    dominant: str          # the cause that lost the most time in the campaign


def project(m: PolicyMeasures, reference_ettr: float, nodes: int, node_mtbf_s: float) -> Projection | None:
    """None where the policy had no fault applied (nothing to scale)."""
    if not m.faults or not reference_ettr > 0:
        return None
    cost = max(0.0, m.wall_s * (1 - m.ettr / reference_ettr) / len(m.faults))
    job_mtbf = node_mtbf_s / nodes
    dominant = max((c for c in CAUSES if c != "other"), key=lambda c: m.lost_s[c])
    return Projection(cost, job_mtbf, reference_ettr * max(0.0, 1 - cost / job_mtbf), dominant)


def projection_text(campaign: dict[str, Any], measured: dict[str, tuple[PolicyMeasures, list, float]]) -> list[str]:
    scale = campaign.get("projection")
    reference = measured.get("reference")
    if not scale or reference is None:
        return []
    nodes, mtbf = scale["nodes"], scale["node_mtbf_s"]
    e0 = reference[0].ettr
    lines = ["", f"## Projection to {nodes} nodes of {mtbf / 3600:g} h MTBF each: a MODEL, not a measurement", "",
             f"ETTR ~= e0 x max(0, 1 - c x N / M), with N = {nodes}, M = {mtbf / 3600:g} h (a fault every "
             f"{mtbf / nodes:.0f} s), e0 = {e0:.1%} (the reference's ETTR) and c = each policy's measured seconds "
             "lost per fault, wall x (1 - ETTR / e0) / faults applied. It assumes costs that do not overlap "
             "and do not grow with the job (docs/campaign.md).", "",
             "| policy | faults applied | c: s lost per fault | projected ETTR | what dominates (measured) |",
             "|---|---|---|---|---|"]
    for policy, (m, _, _) in measured.items():
        if policy == "reference":
            continue
        p = project(m, e0, nodes, mtbf)
        lines.append(f"| {policy} | {len(m.faults)} | " + ("- | - | - |" if p is None else
                     f"{p.cost_s:.1f} | {p.ettr:.1%} (projected) | {p.dominant} |"))
    return lines


# -- the report -----------------------------------------------------------------------------

REPORT_FILE = "campaign.md"
PICTURE_FILE = "kept-work.png"


def policy_events(campaign: dict[str, Any], policy: str) -> list[dict[str, Any]]:
    """Every event of the policy's segments, each tagged with its segment, in time order;
    a user's job's steps counted as training steps (resumed_steps)."""
    found = []
    for k, segment in enumerate(campaign["policies"][policy]["segments"]):
        for folder in trial_dirs(Path(segment["run_dir"])):
            path = folder / EVENTS_FILE
            if path.exists():
                found += [{**ev, "segment": k} for ev in read_events(path)[0]]
    return resumed_steps(sorted(found, key=lambda ev: ev["t"]))


def resumed_steps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user's job's `step` events count its process's steps since it began (the hook's
    count), so a job that resumed from a checkpoint numbers from 1 again: here each stretch
    (segment, generation) that began from a restored state gets the step it resumed at
    added to its counts. That step is found as reports.state finds it: the recorded state
    (weights and optimizer) that its state before its first step (`state` at `start`)
    equals, at that state's own training step; a stretch whose start equals no recorded
    state began from scratch (everything before it rolled back). The built-in runner's
    steps are training steps already: it records no `start` state, and its events pass
    unchanged. Events in time order."""
    starts: dict[tuple[int, int], tuple[Any, Any]] = {}
    for ev in events:
        if ev["kind"] == STATE and ev.get("at") == "start":
            starts.setdefault((ev["segment"], ev["gen"]), (ev["fingerprint"], ev.get("optim")))
    if not starts:
        return events
    offsets: dict[tuple[int, int], int] = {}
    recorded: dict[tuple[str, str], int] = {}  # a state's (fingerprint, optim) -> its training step
    out = []
    for ev in events:
        if ev["kind"] not in (STEP, STATE):
            out.append(ev)
            continue
        key = (ev["segment"], ev["gen"])
        if key not in offsets:  # the stretch's first step or state: the states before it are earlier stretches'
            start = starts.get(key)
            offsets[key] = recorded.get((json.dumps(start[0]), json.dumps(start[1])), 0) if start else 0
        step = ev["step"] + offsets[key]
        if ev["kind"] == STATE and ev.get("at") == "step":
            recorded.setdefault((json.dumps(ev["fingerprint"]), json.dumps(ev.get("optim"))), step)
        out.append({**ev, "step": step})
    return out


def campaign_measures(campaign: dict[str, Any]) -> dict[str, tuple[PolicyMeasures, list[dict[str, Any]], float]]:
    """policy -> (its measures, its events, its window start) for every policy that began."""
    duration = campaign["duration_s"]
    measured = {}
    for policy, entry in campaign["policies"].items():
        events = policy_events(campaign, policy)
        start = window_start(events)
        if start is None:
            continue
        last = max(ev["t"] for ev in events)
        # every policy over the same window: a job still at work when it ends (a retry waiting
        # on its rendezvous, a settle step late) is measured to its end, not past it
        end = start + duration if not campaign.get("partial") else min(last, start + duration)
        schedule_of = {(k, i): index for k, segment in enumerate(entry["segments"])
                       for i, index in enumerate(segment["faults"])}
        measured[policy] = (measure(events, start, end, schedule_of), events, start)
    return measured


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def report_text(campaign: dict[str, Any], measured: dict[str, tuple[PolicyMeasures, list, float]]) -> str:
    reference = measured.get("reference")
    ref_goodput = reference[0].goodput if reference else None
    lines = [f"# Campaign: {Path(campaign['scenario']).name} under the {campaign['mix']['name']} mix"
             + (" (PARTIAL: stopped early)" if campaign.get("partial") else ""), "",
             f"`{campaign['command']}`", "",
             f"Mix source: {campaign['mix']['source']}", "",
             f"Faults: Poisson, mean {campaign['mtbf_s']:g} s apart, seed {campaign['seed']}, over a "
             f"{campaign['duration_s']:g} s window per policy ({campaign['ranks']} ranks, "
             f"{campaign['backend']} backend); the same schedule for every policy.", "",
             "| policy | ETTR | goodput (kept steps/s) | vs fault-free | kept steps | wall s | jobs | ranks at the end | "
             "lost: detection | restart | recompute | hang (to the cap) | other | faults applied | hung |",
             "|" + "---|" * 15]
    for policy, (m, _, _) in measured.items():
        ratio = "" if not ref_goodput else f"{m.goodput / ref_goodput:.1%}"
        lost = " | ".join(f"{m.lost_s[c]:.1f}" for c in CAUSES)
        lines.append(f"| {policy} | {m.ettr:.1%} | {m.goodput:.2f} | {ratio} | {m.kept_steps} | {m.wall_s:.1f} | "
                     f"{m.segments} | {m.final_ranks} | {lost} | {len(m.faults)} | {sum(f.hung for f in m.faults)} |")
    for policy, entry in campaign["policies"].items():
        if entry.get("error"):
            lines.append(f"\n{policy} stopped early: {entry['error']}")
    hung = [p for p, (m, _, _) in measured.items() if m.hangs]
    if hung:
        lines.append(f"\nHung (counted to the cap, then started again as a new job): {', '.join(hung)}.")
    lines += projection_text(campaign, measured)
    lines += ["", "ETTR: time on kept steps / wall time. Goodput: kept steps per second, beside the fault-free "
                  "reference's. Lost time in seconds by cause (docs/campaign.md).", "",
              "## The mapping", "", "| category | share | injected as |", "|---|---|---|"]
    lines += [f"| {m['category']} | {m['share']:.1%} | {m['injects']} |" for m in campaign["mapping"]]
    lines += ["", "## Per fault: s to the first detection / to the next step after it", "",
              "| # | at s | category | fault | " + " | ".join(p for p in measured if p != "reference") + " |",
              "|" + "---|" * (4 + len([p for p in measured if p != "reference"]))]
    costs = {p: {f.index: f for f in m.faults} for p, (m, _, _) in measured.items()}
    for i, fault in enumerate(campaign["schedule"]):
        what = (f"{fault['fault']['kind']} r{fault['target']}" + (f" {fault['duration']:g} s" if fault['duration'] else "")
                if fault["fault"] else f"left out ({fault['left_out']})")
        cells = []
        for policy in (p for p in measured if p != "reference"):
            cost = costs[policy].get(i)
            cells.append("not applied (job down or rank gone)" if cost is None else
                         f"{_seconds(cost.detect_s)} / {_seconds(cost.resume_s)}" + (" hung to the cap" if cost.hung else "")
                         # a restarted job's faults land by its expected start, not exactly at their time
                         + (f" (applied at {cost.t:.1f})" if abs(cost.t - fault["at"]) > 0.5 else ""))
        lines.append(f"| {i} | {fault['at']:.1f} | {fault['category']} | {what} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def summary_text(campaign: dict[str, Any], measured: dict[str, tuple[PolicyMeasures, list, float]]) -> str:
    reference = measured.get("reference")
    lines = [f"{'policy':12} {'ETTR':>6} {'goodput':>8} {'vs ref':>7} {'jobs':>4} {'ranks':>5}  lost s: "
             + " ".join(f"{c:>9}" for c in CAUSES)]
    for policy, (m, _, _) in measured.items():
        ratio = f"{m.goodput / reference[0].goodput:.0%}" if reference and reference[0].goodput else "-"
        lines.append(f"{policy:12} {m.ettr:6.1%} {m.goodput:8.2f} {ratio:>7} {m.segments:4} {m.final_ranks:5}  "
                     + " ".join(f"{m.lost_s[c]:9.1f}" for c in CAUSES)
                     + (f"  ({m.hangs} hung to the cap)" if m.hangs else ""))
    return "\n".join(lines)


def kept_work_figure(campaign: dict[str, Any], measured: dict[str, tuple[PolicyMeasures, list, float]]) -> Figure:
    fig = Figure(figsize=(11, 5.5), layout="constrained")
    ax = fig.subplots()
    for policy, (m, events, start) in measured.items():
        times, kept = kept_curve(events, start, start + m.wall_s)
        style = {"color": "black", "lw": 2, "ls": "--"} if policy == "reference" else {"lw": 1.3}
        label = "fault-free reference" if policy == "reference" else f"{policy} (ETTR {m.ettr:.0%})"
        ax.plot(times, kept, drawstyle="steps-post", label=label, **style)
    top = ax.get_ylim()[1]
    for fault in campaign["schedule"]:
        if fault["fault"]:
            ax.axvline(fault["at"], color="red", alpha=0.25, lw=0.8)
            ax.text(fault["at"], top, fault["fault"]["kind"], rotation=90, fontsize=7, va="top", color="red")
    ax.set_xlabel("wall time in the window (s); red: the schedule's faults")
    ax.set_ylabel("kept steps")
    ax.set_title(f"kept work over wall time: {campaign['mix']['name']} mix, mean {campaign['mtbf_s']:g} s "
                 f"between faults" + (" (partial)" if campaign.get("partial") else ""))
    if measured:
        ax.legend(loc="upper left", fontsize=8)
    return fig


def write_campaign_report(folder: Path) -> str:
    """Write the campaign's report and picture into its folder; returns the summary to print."""
    campaign = json.loads((Path(folder) / CAMPAIGN_FILE).read_text())
    if campaign.get("format") != CAMPAIGN_FORMAT:
        raise RunFolderError(f"{Path(folder) / CAMPAIGN_FILE}: campaign format {campaign.get('format')!r}; this "
                             f"harness reads format {CAMPAIGN_FORMAT}: report it with the harness that made it")
    measured = campaign_measures(campaign)
    (Path(folder) / REPORT_FILE).write_text(report_text(campaign, measured))
    kept_work_figure(campaign, measured).savefig(Path(folder) / PICTURE_FILE, dpi=110)
    projected = projection_text(campaign, measured)
    return (summary_text(campaign, measured) + ("\n" + "\n".join(projected) if projected else "") + f"\n\ncampaign folder: {folder}\nreport:  {Path(folder) / REPORT_FILE}"
            f"\npicture: {Path(folder) / PICTURE_FILE}" + ("\n(partial: stopped early)" if campaign.get("partial") else ""))


SPREAD_FILE = "spread.md"


def spread_text(folders: list[Path], parent: Path) -> str:
    """Each policy's figures over the windows of a repeated campaign: the median and the
    range; written to PARENT/spread.md, returned to print."""
    values: dict[str, dict[str, list[float]]] = {}
    for folder in folders:
        measured = campaign_measures(json.loads((Path(folder) / CAMPAIGN_FILE).read_text()))
        reference = measured.get("reference")
        for policy, (m, _, _) in measured.items():
            row = values.setdefault(policy, {})
            row.setdefault("ETTR", []).append(m.ettr)
            if reference and reference[0].goodput:
                row.setdefault("vs fault-free", []).append(m.goodput / reference[0].goodput)
            for cause in CAUSES:
                row.setdefault(f"{cause} s", []).append(m.lost_s[cause])
    names = ["ETTR", "vs fault-free", *(f"{c} s" for c in CAUSES)]

    def cell(name: str, found: list[float]) -> str:
        if not found:
            return "-"
        if name.endswith(" s"):
            return f"{statistics.median(found):.1f} ({min(found):.1f}-{max(found):.1f})"
        return f"{statistics.median(found):.1%} ({min(found):.1%}-{max(found):.1%})"
    lines = [f"Over {len(folders)} windows: median (min-max)", "",
             "| policy | windows | " + " | ".join(names) + " |", "|" + "---|" * (2 + len(names))]
    lines += [f"| {policy} | {len(row['ETTR'])} | " + " | ".join(cell(n, row.get(n, [])) for n in names) + " |"
              for policy, row in values.items()]
    text = "\n".join(lines) + "\n"
    (Path(parent) / SPREAD_FILE).write_text(f"# Campaign spread\n\n{text}")
    return text + f"\nspread: {Path(parent) / SPREAD_FILE}"
