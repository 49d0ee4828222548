"""The failure detector against the document's policies, fault by fault, side by side.

    sudo flock /tmp/chaos-cpu.lock .venv/bin/python bench/detector.py \
        [--faults kill,blackhole,link_down,pause,loss] \
        [--policies pytorch_default,timeout,retry,isolation,retry_fd,elastic,elastic_rejoin,torchrun] \
        [--control-runs 10] [--out DIR]
    .venv/bin/python bench/detector.py --analyze DIR    # the table of a stored run, again
    sudo .venv/bin/python bench/detector.py --ranks 16 32 64 [--control-seconds 60] [--out DIR] \
        [--suspect-after 0.8 0.4] [--exclude-after 0.3] [--arp-retrans 1 0.1] [--hogs 2] \
        [--gloo-connects at-start on-first-use] [--previous-defaults]
    .venv/bin/python bench/detector.py --ranks 16 64 --analyze DIR [--suspect-after ...] [--exclude-after ...] [--previous-defaults]

`--suspect-after` measures the detector policies with each silence threshold side by side
(the row "default" is the policies' own); `--exclude-after` likewise with each grace a
suspect member gets before the survivors leave it out; `--arp-retrans` likewise with each
ARP retransmission time of the hosts (how long, at most, a host's first packet to the
control plane waits after its link comes back); `--gloo-connects` likewise with gloo
connecting every pair when a group is made and each pair on first use
(workload.gloo_lazy_init); `--previous-defaults` adds a first row
with the detector's defaults before 2026-12-01 (PREVIOUS_DEFAULTS), today's side by side
with them in one run; `--hogs N` runs N busy processes
beside the job the whole time (the issue's "no false trip with two CPU hogs"). Under the
table, each size's time split into its phases: after the blackhole, the last survivor to
suspect, to leave the silent rank out, to have the smaller group, to restore, to step;
after the heal, the left-out rank asking back, its admission, the full group, restored,
stepping.

With --ranks, per size, scaled the way `chaos run --ranks` scales a scenario (docs/scale.md):
a blackhole on rank 5 that never heals under `elastic`, rank 5's link down 10 s under
`elastic_rejoin`, and `--control-seconds` of steps with no fault under `elastic`. One row
per size: first and last surviving rank's suspect time, survivors stepping again, all
back after the heal, false trips, and the harness's own CPU share (its process's CPU
seconds from /proc over the trial's wall time, with the load average beside it, and the
share of the machine's CPU time its VM's host took while the ranks ran). The
figures come from the stored run folders through reports; a size that fails says why.

For the 16-rank job and each fault on rank 5 (kill; blackhole that never heals; link down
10 s; freeze 10 s; 20% loss for 20 s), every policy runs on a fresh cluster:

    pytorch_default  gloo's default 30 min timeout, no retry (watched up to the hang cap)
    timeout, retry, isolation   the document's policies with its 15 s timeout
    retry_fd         retry with the failure detector and short backoff
    elastic          the detector, and the survivors go on without an unreachable rank
    elastic_rejoin   elastic, and the rank left out is let back in once it is reachable
    torchrun         TorchElastic: one torchrun agent per namespace, --max-restarts=3, c10d
                     rendezvous, workers with their own store (bench/torchrun_kill.py
                     --no-share-store: with torchrun's defaults every restart fails here);
                     the kill fault only (it restarts on a worker's exit; any other fault
                     leaves its workers in gloo's 30 min timeout like pytorch_default)

It prints, per fault and policy: outcome, time-to-detect (first rank and last rank),
time-to-recover (from fault start, and from fault end for faults that heal), breaker
open (our elastic policy: when the survivors left the rank out), survivors stepping
again, wasted rank-seconds, and ratios against the document's 15 s / 12 s / 30 s. Then
the fault-free control scenario `--control-runs` times, counting false trips (suspect
events). Targets: TTD <= 1.0 s (silent) / 0.3 s (killed), TTR after heal <= 1.0 s,
survivors stepping again <= 3 s after a permanent fault starts, zero false trips.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torchrun_kill
from bringup import GLOO_CONNECTS
from control_plane import cpu_seconds
import yaml

from chaos.errors import ChaosError
from harness import signals
from harness.cluster.backends import backend_named
from harness.job.policies import DetectorSpec, PolicySpec
from harness.scenario.scaling import scaled_to_cores
from harness.scenario.scenario import Scenario, load_scenario
from harness.trial import machine
from harness.trial.hogs import cpu_hogs
from harness.trial.scenario_run import run_scenario
from harness.trial.progress import Progress
import reports
from runfolder.events import (ADMIT, EVENTS_FILE, EXCLUDE, FAULT_APPLIED, FAULT_REVERTED, GROUP_READY, GROUP_RELEASED,
                              REJOIN_REQUEST, RESTORED, STEP, SUSPECT, TRIAL_END, WARMUP_DONE, read_events)
from runfolder.layout import RUN_FILE, trial_dirs

REPO = Path(__file__).resolve().parent.parent
DOCUMENT = {"ttd": 15.0, "ttr": 12.0, "breaker": 30.0}  # the document's claims, seconds
FAULTS = {
    "kill": {"kind": "kill"},
    "blackhole": {"kind": "blackhole"},
    "link_down": {"kind": "link_down", "duration": "10s"},
    "pause": {"kind": "pause", "duration": "10s"},
    "loss": {"kind": "loss", "percent": "20%", "duration": "20s"},
}
_DOC = {"timeout": "15s", "rendezvous_timeout": "30s", "backoff_base": "2s", "backoff_cap": "16s"}
POLICIES = {
    "pytorch_default": {"base": "baseline", "timeout": "30m"},
    "timeout": {"timeout": "15s"},
    "retry": {**_DOC, "max_retries": 3},
    "isolation": {**_DOC, "max_retries": 3},
    "retry_fd": {"base": "retry", "detector": {}, "timeout": "10s", "rendezvous_timeout": "30s",
                 "max_retries": 100, "backoff_base": "20ms", "backoff_cap": "200ms",
                 "jitter": ["0s", "30ms"]},
    "elastic": {},
    # a rank left out comes back once it is reachable (waits up to 15 s: the faults that
    # never heal would otherwise keep the trial 60 s longer)
    "elastic_rejoin": {"base": "elastic", "rejoin": True, "rejoin_within": "15s"},
}
EXTERNAL = {"torchrun": ("kill",)}  # not harness policies: the faults each is measured on
CONTROL = "control"  # no fault: every suspect event is a false trip
# --ranks: the silent faults, each under the detector policy that shows its figure: the
# survivors going on without a rank silent for good, and all of them back after a heal
SCALE_TRIALS = {"blackhole": "elastic", "link_down": "elastic_rejoin", CONTROL: "elastic"}
CPU_FILE = "harness_cpu.json"  # per trial of a size: the harness's CPU seconds, wall, load
HOGS_FILE = "hogs.json"        # in --out: how many CPU hogs ran beside the job, for --analyze
DETECTOR_POLICIES = ("elastic", "elastic_rejoin")  # what --suspect-after tunes (their base is elastic)
# --arp-retrans: after a link comes back, a host's first packet to the control plane waits
# for the neighbour entry's next probe, this long at most (chaos.sysctl; docs/scale.md)
ARP_RETRANS = "net.ipv4.neigh.eth0.retrans_time_ms"


@dataclass(frozen=True)
class Tuning:
    """The settings a --ranks row measures: the detector policies' thresholds and heartbeat
    period, the hosts' ARP retransmission time (seconds), and whether gloo connects each
    pair on first use; None: the policies' own, the kernel's, the workload's."""

    suspect_after: float | None = None
    exclude_after: float | None = None
    arp_retrans: float | None = None
    interval: float | None = None
    gloo_lazy_init: bool | None = None

    def overrides(self) -> dict:
        detector = {name: f"{value:g}s" for name, value in
                    (("suspect_after", self.suspect_after), ("interval", self.interval)) if value is not None}
        return {**({"detector": detector} if detector else {}),
                **({"exclude_after": f"{self.exclude_after:g}s"} if self.exclude_after is not None else {})}

    def sysctls(self) -> dict:
        return {} if self.arp_retrans is None else {ARP_RETRANS: round(self.arp_retrans * 1000)}

    def workload(self) -> dict:
        return {} if self.gloo_lazy_init is None else {"gloo_lazy_init": self.gloo_lazy_init}

    def folder(self, ranks: int) -> str:
        return f"ranks-{ranks}" + "".join(f"-{name}-{value:g}s" for name, value in
                                          (("suspect", self.suspect_after), ("exclude", self.exclude_after),
                                           ("arp", self.arp_retrans), ("beat", self.interval))
                                          if value is not None) + {
            None: "", True: "-gloo-lazy", False: "-gloo-mesh"}[self.gloo_lazy_init]


# --previous-defaults: the detector's defaults until 2026-12-01 (0.8 s = eight 0.1 s beats)
PREVIOUS_DEFAULTS = Tuning(suspect_after=0.8, exclude_after=1.0, interval=0.1)


def scenario_text(fault: str, policies: list[str], tuning: Tuning = Tuning()) -> str:
    """The 16-rank scenario of `fault` on rank 5 (CONTROL: none) under `policies`; the
    detector policies with `tuning` instead of their defaults."""
    policies = [p for p in policies if p in POLICIES]
    specs = {p: {**POLICIES[p], **tuning.overrides()} if p in DETECTOR_POLICIES else POLICIES[p]
             for p in policies}
    events = []
    if fault != CONTROL:
        spec = dict(FAULTS[fault])
        duration = spec.pop("duration", None)
        events.append({**spec, "target": {"rank": 5}, "start": "1s", **({"duration": duration} if duration else {})})
    return yaml.safe_dump({
        "name": f"bench_{fault}", "seed": 1,
        "cluster": {"ranks": 16, **({"sysctls": sysctls} if (sysctls := tuning.sysctls()) else {})},
        "workload": {"step_period": "250ms", "checkpoint_every": 10, **tuning.workload()}, "warmup_steps": 12,
        "faults": events, "hang_cap": "20s", "settle_steps": 8, "policies": specs}, sort_keys=False)


def breaker_or_exclusion(row) -> float:
    """When the breaker opened on any rank, or the survivors first left a rank out."""
    marks = [t for t in (row["breaker_open_s"], row["excluded_s"]) if not math.isnan(t)]
    return min(marks, default=math.nan)


def fmt(value: float, unit: str = "s") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}{unit}"


def ratio(document: float, ours: float) -> str:
    if not ours or math.isnan(ours):
        return "-"
    times = document / ours
    return f"{times:.0f}x" if times >= 10 else f"{times:.1f}x"


def measure_torchrun(out: Path) -> None:
    """The kill fault under torchrun (its agents restart every worker, from step 0), as the
    run folder out/torchrun; one that did not start says so in its trial_end."""
    try:
        torchrun_kill.measure(16, out / "torchrun", no_share_store=True)
    except (RuntimeError, TimeoutError) as exc:  # it did not start: say so, measure the rest
        print(f"torchrun: {exc}", file=sys.stderr)


def measure_fault(fault: str, policies: list[str], out: Path, progress: Progress) -> None:
    if any(fault in EXTERNAL.get(p, ()) for p in policies):
        measure_torchrun(out)
    policies = [p for p in policies if p in POLICIES]
    if policies:
        path = out / f"bench_{fault}.yaml"
        path.write_text(scenario_text(fault, policies))
        run_scenario(load_scenario(path), path, policies, out, backend_named("netns"), progress)


def latest_run(out: Path, name: str) -> Path | None:
    runs = sorted(out.glob(f"{name}-*/trials"))  # run folders are named <scenario>-<time>-<id>
    return runs[-1].parent if runs else None


def fault_rows(fault: str, policies: list[str], out: Path) -> list[dict]:
    """The rows of one fault, from the run folders under `out` (measured now or before)."""
    torchrun = out / "torchrun"  # a run folder of its own (bench/torchrun_kill.py)
    measured = [latest_run(out, f"bench_{fault}")]
    if any(fault in EXTERNAL.get(p, ()) for p in policies) and (torchrun / RUN_FILE).is_file():
        measured.insert(0, torchrun)
    rows = []
    for run_dir in filter(None, measured):
        for _, row in reports.analyze_run(run_dir).iterrows():
            if row["policy"] not in policies:
                continue
            rows.append({"fault": fault, "policy": row["policy"], "outcome": row["outcome"],
                         "ttd": row["ttd_s"], "ttd_last": row["ttd_max_s"], "ttr": row["ttr_s"],
                         "ttr_heal": row["ttr_after_end_s"], "breaker": breaker_or_exclusion(row),
                         "hung_cap": row["hung_cap"], "wasted": row["wasted_rank_s"]})
    return rows


def print_table(rows: list[dict]) -> None:
    head = ("fault", "policy", "outcome", "TTD first", "TTD last", "survivors step again",
            "after heal", "breaker", "wasted r*s", "TTD 15s/x", "TTR 12s/x", "breaker 30s/x")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        outcome = r["outcome"] + (f" >= {r['hung_cap']:g}s" if r["outcome"] == "hung" else "")
        # after a heal only a recovery counts from the heal; going on without the rank
        # (continued) happens while the fault lasts and counts from its start
        healed = r["ttr_heal"] if r["outcome"] == "recovered" else math.nan
        recover = r["ttr"] if math.isnan(healed) else healed
        print("| " + " | ".join([
            r["fault"], r["policy"], outcome, fmt(r["ttd"]), fmt(r["ttd_last"]), fmt(r["ttr"]),
            fmt(healed), fmt(r["breaker"]), fmt(r["wasted"], ""),
            ratio(DOCUMENT["ttd"], r["ttd"]), ratio(DOCUMENT["ttr"], recover),
            ratio(DOCUMENT["breaker"], r["breaker"])]) + " |")


def scale_scenario(path: Path, ranks: int, control_s: float) -> Scenario:
    """The bench scenario at `ranks` ranks, scaled the way `chaos run --ranks` scales it; the
    control watches for `control_s` seconds of steps."""
    scenario = scaled_to_cores(load_scenario(path, {"cluster.ranks": ranks}))
    if scenario.faults:
        return scenario
    # a trial without faults is watched for 3 hang caps at most (harness.trial.orchestrator)
    return scenario.model_copy(update={"settle_steps": math.ceil(control_s / scenario.workload.step_period),
                                       "hang_cap": max(scenario.hang_cap, control_s / 2)})


def observed_s(run_dir: Path) -> float:
    """How long a trial was watched after its warm-up (its events: warmup_done to trial_end)."""
    [trial] = trial_dirs(run_dir)
    events, _ = read_events(trial / EVENTS_FILE)
    times = {e["kind"]: e["t"] for e in events if e["kind"] in (WARMUP_DONE, TRIAL_END)}
    return times[TRIAL_END] - times[WARMUP_DONE] if len(times) == 2 else math.nan


def measure_size(ranks: int, out: Path, control_s: float, progress: Progress,
                 tuning: Tuning = Tuning()) -> None:
    """Every SCALE_TRIALS trial at `ranks` ranks into out; the harness's CPU seconds, wall and
    load of each (or why it failed) into out/CPU_FILE."""
    out.mkdir(parents=True, exist_ok=True)
    cpu: dict[str, dict] = {}
    for fault, policy in SCALE_TRIALS.items():
        path = out / f"bench_{fault}.yaml"
        path.write_text(scenario_text(fault, [policy], tuning))
        wall0, cpu0 = time.monotonic(), cpu_seconds()
        try:
            run_scenario(scale_scenario(path, ranks, control_s), path, [policy], out,
                         backend_named("netns"), progress)
            cpu[fault] = {"cpu_s": cpu_seconds() - cpu0, "wall_s": time.monotonic() - wall0}
        except (ChaosError, OSError) as exc:  # a size that fails says why; the others run
            cpu[fault] = {"failed": f"{type(exc).__name__}: {exc}"}
        cpu[fault]["load_1m"] = os.getloadavg()[0]
        (out / CPU_FILE).write_text(json.dumps(cpu, indent=1))


def size_row(ranks: int, tuning: Tuning, out: Path) -> list[str]:
    """One size's figures, from its run folders (reports) and CPU_FILE."""
    cpu = json.loads((out / CPU_FILE).read_text()) if (out / CPU_FILE).is_file() else {}
    cells, failures = [str(ranks)] + ["default" if v is None else f"{v:g}s"
                                      for v in (tuning.interval, tuning.suspect_after, tuning.exclude_after,
                                                tuning.arp_retrans)], []
    cells.append({None: "default", True: "on first use", False: "at start"}[tuning.gloo_lazy_init])
    for fault in SCALE_TRIALS:
        run_dir = latest_run(out, f"bench_{fault}")
        failed = cpu.get(fault, {}).get("failed")
        if failed or run_dir is None:
            failures.append(f"{fault}: {failed or 'not measured'}")
            cells += ["failed"] * (2 if fault == CONTROL else 5)
            continue
        r = reports.analyze_run(run_dir).iloc[0]
        if fault == CONTROL:
            cells.append(f"{int(r['suspect_events'])} in {observed_s(run_dir):.0f} s of steps")
        else:
            outcome = r["outcome"] + (f" >= {r['hung_cap']:g}s" if r["outcome"] == "hung" else "")
            after = r["ttr_s"] if fault == "blackhole" else r["ttr_after_end_s"]
            cells += [outcome, fmt(r["ttd_s"]), fmt(r["ttd_max_s"]), fmt(after)]
        share, steal = cpu[fault]["cpu_s"] / cpu[fault]["wall_s"], r["host_steal_share"]
        cells.append(f"{share:.0%} (load {cpu[fault]['load_1m']:.1f}"
                     f"{'' if math.isnan(steal) else f', steal {steal:.0%}'})")
    return cells + ["; ".join(failures)]


# The phases of a recovery, in order: per rank the first such event after the fault's start
# (or its end), a phase's time the last rank's; `step` is each rank's first after its new group.
# After a heal, "released" is the last member to end the step that carried the admission and
# let its group go; the rank let back in released its own when its breaker opened.
PHASES = {"blackhole": ((SUSPECT, "suspect"), (EXCLUDE, "left out"), (GROUP_READY, "group"),
                        (RESTORED, "restored"), (STEP, "stepping")),
          "link_down": ((REJOIN_REQUEST, "asks back"), (ADMIT, "admitted"), (GROUP_RELEASED, "released"),
                        (GROUP_READY, "group"), (RESTORED, "restored"), (STEP, "stepping"))}


def phase_times(events: list[dict], since: float, phases: tuple[tuple[str, str], ...]) -> list[str]:
    """'label time' per phase, seconds from `since`; a phase no rank reached: 'not observed'."""
    after = [e for e in events if e["t"] >= since and e.get("src") == "rank"]
    group_at: dict[int, float] = {}  # each rank's first new group: its steps count from there
    for e in after:
        if e["kind"] == GROUP_READY:
            group_at.setdefault(e["rank"], e["t"])
    # a rank let back in has no group to let go after the heal: its next release is at the end
    let_in = {peer for e in after if e["kind"] == ADMIT for peer in e["peers"]}
    cells = []
    for kind, label in phases:
        firsts: dict[int, float] = {}
        for e in after:
            if kind == GROUP_RELEASED and e["rank"] in let_in:
                continue
            if e["kind"] == kind and (kind != STEP or e["t"] >= group_at.get(e["rank"], math.inf)):
                firsts.setdefault(e["rank"], e["t"])
        cells.append(f"{label} {max(firsts.values()) - since:.2f}" if firsts else f"{label} not observed")
    return cells


def phases_line(run_dir: Path, fault: str) -> str:
    [trial] = trial_dirs(run_dir)
    events, _ = read_events(trial / EVENTS_FILE)
    mark = FAULT_APPLIED if fault == "blackhole" else FAULT_REVERTED
    since = next((e["t"] for e in events if e["kind"] == mark), None)
    if since is None:
        return f"{fault}: no {mark} event"
    start = "fault start" if fault == "blackhole" else "heal"
    return f"{fault}, s after the {start}: " + " > ".join(phase_times(events, since, PHASES[fault]))


def print_phases(sizes: list[int], settings: list[Tuning], out: Path) -> None:
    print("\nphases (the last rank to reach each):")
    for ranks in sizes:
        for tuning in settings:
            lines = [phases_line(run_dir, fault) for fault in PHASES
                     if (run_dir := latest_run(out / tuning.folder(ranks), f"bench_{fault}")) is not None]
            for line in lines or ["not measured"]:
                print(f"- {tuning.folder(ranks)}: {line}")


def print_scale(sizes: list[int], settings: list[Tuning], out: Path, hogs: int | None) -> None:
    head = ("ranks", "heartbeat", "suspect after", "exclude after", "ARP retransmit", "gloo connects",
            "blackhole (elastic)", "suspect first", "suspect last", "survivors step again",
            "harness CPU", "link down 10 s x k (elastic_rejoin)", "suspect first", "suspect last",
            "all back after the heal", "harness CPU", "false trips (elastic, no fault)", "harness CPU",
            "failed")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for ranks in sizes:
        for tuning in settings:
            print("| " + " | ".join(size_row(ranks, tuning, out / tuning.folder(ranks))) + " |")
    print(f"\n{os.cpu_count()} CPUs, {'an unrecorded number of' if hogs is None else hogs} CPU hog(s) "
          f"beside the job; heartbeat: each rank's heartbeat "
          f"period (default {DetectorSpec().interval:g} s); suspect after: the detector's "
          f"silence threshold (default {DetectorSpec().suspect_after:g} s); exclude after: how long "
          f"the survivors wait for a suspect to speak again before they leave it out (default "
          f"{PolicySpec.model_fields['exclude_after'].default:g} s); ARP retransmit: the hosts' "
          f"{ARP_RETRANS} (default: the kernel's, 1 s); gloo connects: every pair when the group is "
          "made, or each pair on first use (workload.gloo_lazy_init, default at start); heartbeat, suspect and exclude after are never stretched "
          "(past 8 ranks per core the steps and timeouts are, by k: docs/scale.md); times from the fault's start "
          "(after the heal: from its end); suspect first/last: over every rank that suspected, the "
          "silent one included; harness "
          "CPU: its process's CPU seconds over the trial's wall time, 1-minute load average at the end, "
          "and the share of the machine's CPU time its VM's host took while the ranks ran (steal, where the "
          "kernel counts it: a slow row with a high share is the host's); "
          "targets (issue 16): every survivor suspects a silent rank within 0.5 s at 16 ranks and 1.0 s "
          "at 64, survivors step again within 1.0 s at 16, all back within 0.5 s of a heal, no false trip")


def main_scale(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if min(args.ranks) < 6:
        parser.error(f"--ranks {min(args.ranks)}: the fault is on rank 5; give 6 or more")
    if args.analyze is not None and not args.analyze.is_dir():
        parser.error(f"--analyze {args.analyze}: no such folder")
    if any(s <= 2 * DetectorSpec().interval for s in args.suspect_after or []):
        parser.error(f"--suspect-after: give more than twice the heartbeat period ({DetectorSpec().interval:g} s)")
    if any(s <= 0 for s in args.exclude_after or []):
        parser.error("--exclude-after: give a positive number of seconds")
    if any(s <= 0 for s in args.arp_retrans or []):
        parser.error("--arp-retrans: give a positive number of seconds")
    settings = ([PREVIOUS_DEFAULTS] if args.previous_defaults else []) + [
        Tuning(s, e, a, gloo_lazy_init=lazy) for s in args.suspect_after or [None]
        for e in args.exclude_after or [None] for a in args.arp_retrans or [None]
        for lazy in [GLOO_CONNECTS[c] for c in args.gloo_connects or []] or [None]]
    out = args.analyze or args.out or Path(tempfile.mkdtemp(prefix="bench-detector-"))
    if args.analyze is None:
        progress = Progress(quiet=args.quiet)
        signals.install()
        out.mkdir(parents=True, exist_ok=True)
        (out / HOGS_FILE).write_text(json.dumps(args.hogs))
        machine.record(out)
        with cpu_hogs(args.hogs):
            for ranks in args.ranks:
                for tuning in settings:
                    measure_size(ranks, out / tuning.folder(ranks), args.control_seconds, progress, tuning)
    print_scale(args.ranks, settings, out,
                json.loads((out / HOGS_FILE).read_text()) if (out / HOGS_FILE).is_file() else None)
    print_phases(args.ranks, settings, out)
    print(f"\n{machine.recorded_line(out)}\nrun folders: {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--policies", default=",".join([*POLICIES, *EXTERNAL]))
    parser.add_argument("--control-runs", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None, help="run folders (default: a temp dir)")
    parser.add_argument("--analyze", type=Path, default=None, metavar="DIR",
                        help="measure nothing: print the table of the run folders in DIR "
                             "(the --out of an earlier run)")
    parser.add_argument("--ranks", type=int, nargs="+", default=None, metavar="N",
                        help="per size: the silent faults under the detector and a fault-free "
                             "control (instead of --faults/--policies/--control-runs)")
    parser.add_argument("--control-seconds", type=float, default=60.0,
                        help="with --ranks: how long the fault-free control steps (default 60)")
    parser.add_argument("--suspect-after", type=float, nargs="+", default=None, metavar="S",
                        help="with --ranks: also measure the detector policies with these silence "
                             "thresholds in seconds, side by side (default: only the policies' own)")
    parser.add_argument("--exclude-after", type=float, nargs="+", default=None, metavar="S",
                        help="with --ranks: also measure the elastic policies with these graces "
                             "before a suspect member is left out, side by side (default: the policies' own)")
    parser.add_argument("--arp-retrans", type=float, nargs="+", default=None, metavar="S",
                        help="with --ranks: also measure with the hosts' ARP retransmission time set "
                             f"to these seconds ({ARP_RETRANS}), side by side (default: the kernel's, 1 s)")
    parser.add_argument("--gloo-connects", nargs="+", choices=GLOO_CONNECTS, default=None,
                        help="with --ranks: also measure with gloo connecting every pair at start "
                             "and/or each pair on first use (workload.gloo_lazy_init), side by side")
    parser.add_argument("--previous-defaults", action="store_true",
                        help="with --ranks: also measure the detector's defaults before 2026-12-01 "
                             "(heartbeat 0.1 s, suspect after 0.8 s, exclude after 1 s), in a first row")
    parser.add_argument("--hogs", type=int, default=0,
                        help="with --ranks: this many busy CPU processes beside the job throughout")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.ranks is not None:
        return main_scale(args, parser)
    faults, policies = args.faults.split(","), args.policies.split(",")
    unknown = ([f for f in faults if f not in FAULTS]
               + [p for p in policies if p not in POLICIES and p not in EXTERNAL])
    if unknown:
        parser.error(f"unknown fault or policy: {', '.join(unknown)}")
    if args.analyze is not None and not args.analyze.is_dir():
        parser.error(f"--analyze {args.analyze}: no such folder")
    out = args.analyze or args.out or Path(tempfile.mkdtemp(prefix="bench-detector-"))
    if args.analyze is None:
        out.mkdir(parents=True, exist_ok=True)
        machine.record(out)
        progress = Progress(quiet=args.quiet)
        signals.install()
        for fault in faults:
            measure_fault(fault, policies, out, progress)
        control = REPO / "scenarios" / "detector_no_fault.yaml"
        for _ in range(args.control_runs):
            run_scenario(load_scenario(control), control, ["elastic"], out, backend_named("netns"),
                         progress)
    print_table([row for fault in faults for row in fault_rows(fault, policies, out)])
    # in a fault-free run every suspect event is a false trip
    trips = [int(reports.analyze_run(d.parent)["suspect_events"].sum())
             for d in sorted(out.glob("detector_no_fault-*/trials"))]
    if trips:
        print(f"\nfalse trips in {len(trips)} fault-free runs of ~60 s: {sum(trips)} "
              f"(per run: {trips})")
    print(f"\n{machine.recorded_line(out)}\nrun folders: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
