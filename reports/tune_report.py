"""`chaos tune`'s result: what a tune found (Findings) written as tune.md (the measurement,
the candidates with their rules and evidence, the references, the retry wave, what the
settings do per fault, torchrun's restarts and hosts, the failure detector, and the choice
with the lines to paste), as tune.json, and as the trade-off picture."""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from reports.tune import (BREAKER_SUFFIX, TORCHRUN_SUFFIX, WAVE_WINDOW_S, Candidate, DetectorCandidate,
                          DetectorEvidence, Evidence, FaultFree, FaultResult, Reference, Wave, breaker_verdict,
                          choose_detector, dead_host_notes, elastic_policy, flap_warnings, wave_jitter)
from reports.tune_torchrun import (OWN_STORE_ENV, RESTART_EXTRA_S, HostsResult, RestartResult, hosts_choice,
                                   max_restarts_of, rdzv_conf_for, restart_choice)
from runfolder.heartbeats import HeartbeatGaps


@dataclass(frozen=True)
class Findings:
    """Everything a tune found, as its report and its JSON say it."""

    measured: FaultFree
    candidates: tuple[Candidate, ...]
    evidence: dict[str, Evidence]
    chosen: str | None
    references: list[Reference]
    transient_s: float
    stopped_early: str | None = None
    variant: dict[str, Any] | None = None   # a user's job: the chosen candidate's `variants:` entry
    hogs: int = 0                           # busy CPU processes beside every stage
    waves: list[Wave] = field(default_factory=list)             # the chosen candidate's retry waves
    per_fault: list[FaultResult] = field(default_factory=list)  # it and the references under --faults
    gaps: HeartbeatGaps | None = None                           # fault-free heartbeat gaps (the built-in workload)
    detectors: tuple[DetectorCandidate, ...] = ()
    detector_evidence: dict[str, DetectorEvidence] = field(default_factory=dict)  # with the default's
    detector_interval_s: float = 0.0
    restarts: list[RestartResult] = field(default_factory=list)  # a user's job under torchrun (job.tune.max_restarts)
    hosts: list[HostsResult] = field(default_factory=list)       # ... and with --nnodes MIN:MAX after a host went

    @property
    def chosen_detector(self) -> DetectorCandidate | None:
        name = choose_detector(self.detector_evidence, self.detectors)
        return next((d for d in self.detectors if d.name == name), None)


def _wave_lines(waves: list[Wave]) -> list[str]:
    if not waves:
        return []
    out = ["## A retry wave", "", "One rank frozen a little longer than the recommended timeout: every other rank fails "
           f"at once and re-joins at the store after its backoff. Re-joins per second: the most in any "
           f"{WAVE_WINDOW_S:g} s.", "", "| jitter | re-joins | over | re-joins per second, at most | every rank "
           "stepping again | outcome |", "|---|---|---|---|---|---|"]
    for w in waves:
        back = f"{w.recover_s:.2f} s" if not math.isnan(w.recover_s) else "not within the trial"
        over = f"{w.spread_s:.2f} s" if not math.isnan(w.spread_s) else "-"
        peak = f"{w.peak_per_s:g}" if not math.isnan(w.peak_per_s) else "-"
        out.append(f"| {w.jitter[0]:g}-{w.jitter[1]:g} s ({w.name}) | {w.rejoins} | {over} | {peak} | {back} | "
                   f"{w.outcome} |")
    return out + [""]


LEGEND = {BREAKER_SUFFIX: "`*_breaker`: the same settings with a breaker (policy isolation)",
          TORCHRUN_SUFFIX: "`*_torchrun`: the same timeout under torchrun with the --max-restarts (and store) "
                           "recommended below",
          "document": "`document`: the document's values (30 s, 3 retries from 2 s, a breaker)",
          "document_30s": "`document_30s`: the document's 30 s through the job's knob",
          "pytorch_default": "`pytorch_default`: PyTorch's gloo timeout (1800 s) and nothing else",
          "as_written": "`as_written`: the job as its command is written"}


def _stuck_lines(rows: Iterable[FaultResult | RestartResult], label: Callable[[Any], str]) -> list[str]:
    """Where each hung trial's processes were at its cap, read from outside (py-spy)."""
    hung = [r for r in rows if r.outcome == "hung" and r.stuck_in]
    if not hung:
        return []
    return (["Where the hung trials were at the cap (py-spy, from outside):", ""]
            + [f"- {label(r)}: stuck in: {r.stuck_in}" for r in hung] + [""])


def _seconds_or(value: float, missing: str = "-") -> str:
    return f"{value:.2f} s" if math.isfinite(value) else missing


def _wasted_and_outcome(outcome: str, wasted_rank_s: float, hang_cap_s: float) -> tuple[str, str]:
    """A table's wasted rank-seconds and outcome cells: a hung trial's, to the cap."""
    hung = outcome == "hung"
    wasted = ("-" if not math.isfinite(wasted_rank_s) else
              f">= {wasted_rank_s:.0f} (to the cap)" if hung else f"{wasted_rank_s:.0f}")
    return wasted, f"hung >= {hang_cap_s:g} s (cap)" if hung else outcome


def _outcome_table(columns: list[str], results: Iterable[FaultResult | RestartResult | HostsResult],
                   cells: Callable[[Any], list[str]], label: Callable[[Any], str]) -> list[str]:
    """A table of trials whose last two columns are wasted rank-seconds and the outcome (a
    hung one's to the cap), then where each hung trial was at its cap."""
    results = list(results)
    out = ["| " + " | ".join([*columns, "wasted rank-seconds", "outcome"]) + " |", "|---" * (len(columns) + 2) + "|"]
    for r in results:
        out.append("| " + " | ".join([*cells(r), *_wasted_and_outcome(r.outcome, r.wasted_rank_s, r.hang_cap_s)]) + " |")
    return out + [""] + _stuck_lines(results, label)


def _fault_lines(results: list[FaultResult], chosen: str | None) -> list[str]:
    if not results:
        return []
    settings = {r.setting for r in results}
    legend = [text for key, text in LEGEND.items() if key in settings or any(n.endswith(key) for n in settings)]
    out = ["## What the settings do, per fault", "", "One rank under each fault of --faults; times from the fault's start; "
           "wasted rank-seconds: every rank's stalls longer than 3 steps until it left or the trial ended "
           "(reports.metrics). " + "; ".join(legend) + ".", ""]
    out += _outcome_table(
        ["fault", "setting", "ranks that knew: first, last", "breaker opened", "every rank stepping again"], results,
        lambda r: [r.fault, r.setting, f"{r.first_s:.2f} s, {r.last_s:.2f} s ({r.detect_ranks} ranks)"
                   if r.detect_ranks else "none", _seconds_or(r.breaker_s), _seconds_or(r.back_s)],
        lambda r: f"{r.fault}, `{r.setting}`")
    verdict = breaker_verdict(results, chosen) if chosen else None
    warnings = (flap_warnings(results, chosen) + dead_host_notes(results, chosen)) if chosen else []
    said = ([f"{verdict[1][0].upper()}{verdict[1][1:]}."] if verdict else []) + warnings
    return out + [line for text in said for line in (text, "")]


def _detector_choice(f: Findings) -> list[str]:
    if not f.detector_evidence:
        return []
    detector = f.chosen_detector
    if detector is None:
        return ["For the elastic policies: no threshold passed (each tripped in a fault-free control or missed the "
                "silent rank somewhere); keep the timeout alone, or give the detector a longer control.", ""]
    return [f"`{detector.name}` (the elastic policies' failure detector): {detector.rule}; of the thresholds that "
            "tripped nothing and with which every rank knew of the silent one, the one it knew soonest with.", ""]


def _detector_lines(f: Findings) -> list[str]:
    if f.gaps is None:
        return []
    g = f.gaps
    out = ["## The failure detector (elastic policies)", "",
           f"Fault-free heartbeat gaps at the control plane: {g.gaps} over {g.watched_s:.0f} s, median "
           f"{g.quantile_s(0.5):.3f} s, p99 {g.quantile_s(0.99):.3f} s, max {g.max_s:.3f} s (rank {g.max_rank}). "
           "Each threshold below ran an elastic policy: a fault-free control (a suspicion there is a false trip), "
           "then one rank stopped for good.", ""]
    if not f.detector_evidence:
        return out + ["(not run: the budget ended first, or no chosen timeout)", ""]
    out += ["| threshold | suspect_after | false trips (controls) | every rank knew of a silent rank | passes |",
            "|---|---|---|---|---|"]
    for name, e in f.detector_evidence.items():
        known = [t for t in e.every_s if not math.isnan(t)]
        knew = (f"median {statistics.median(known):.2f} s of {len(e.every_s)}" if len(known) == len(e.every_s)
                else f"{len(known)} of {len(e.every_s)} trials")
        out.append(f"| {name} | {e.suspect_after:g} s | {sum(e.false_trips)} in {sum(e.control_s):.0f} s over "
                   f"{len(e.control_s)} controls | {knew} | {'yes' if e.passes else 'no'} |")
    return out + [""]


def _restart_lines(results: list[RestartResult]) -> list[str]:
    if not results:
        return []
    return ["## torchrun's restarts", "", f"The chosen timeout under torchrun, one rank paused {RESTART_EXTRA_S:g} s "
            "longer than it: every worker's collective times out and each agent restarts its workers; times from "
            "the pause's start. Own store: " + ", ".join(f"{k}={v}" for k, v in OWN_STORE_ENV.items()) + ".",
            ""] + _outcome_table(
        ["setting", "--max-restarts", "store", "restarts (most by one agent)", "every rank stepping again"], results,
        lambda r: [r.setting, str(r.max_restarts), "own" if r.own_store else "shared (default)", str(r.used),
                   _seconds_or(r.back_s)], lambda r: f"`{r.setting}`")


def _store_env(own_store: bool) -> str:
    """What goes before `torchrun` on the command line to paste: the own store's variable, or nothing."""
    return " ".join(f"{k}={v}" for k, v in OWN_STORE_ENV.items()) + " " if own_store else ""


def _restart_choice_lines(results: list[RestartResult]) -> list[str]:
    if not results:
        return []
    chosen = restart_choice(results)
    if chosen is None:
        return ["Under torchrun, no --max-restarts tried brought every rank back after the pause: the job's "
                "restarts do not recover it here; see the table above and each trial's logs (torchrun's own).", ""]
    n, rule = max_restarts_of(chosen)
    shared = [r for r in results if r.max_restarts and not r.own_store]
    env = _store_env(chosen.own_store)
    if chosen.own_store:
        rule += (f"; {env.strip()}: with the shared store the restarted job ended "
                 + ", ".join(r.outcome for r in shared) + " where its own store brought it back")
    return [f"For torchrun: {rule}; every rank stepped again {chosen.back_s:.2f} s after the pause began.", "",
            "```sh", f"{env}torchrun --max-restarts {n} ...", "```", ""]


def _conf_text(conf: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in conf.items()) if conf else "torch's defaults"


def _hosts_lines(results: list[HostsResult]) -> list[str]:
    if not results:
        return []
    first = results[0]
    return ["## A host gone for good, under torchrun", "",
            f"The chosen timeout under torchrun with the --max-restarts and store recommended, and --nnodes "
            f"{first.min_hosts}:{first.hosts} (job.min_hosts {first.min_hosts}): the job may go on without one host; "
            "how many it may lose is yours to choose (its batch, its memory per rank). Times from the fault's start.",
            ""] + _outcome_table(
        ["fault", "setting", "--rdzv-conf", "hosts after", "restarts (most by one agent)", "every rank stepping again"],
        results, lambda r: [r.fault, r.setting, _conf_text(r.rdzv_conf), "-" if r.world is None else str(r.world),
                            str(r.used), _seconds_or(r.back_s)], lambda r: f"{r.fault}, `{r.setting}`")


def _hosts_choice_lines(results: list[HostsResult], restarts: list[RestartResult], measured: FaultFree) -> list[str]:
    if not results:
        return []
    rows = hosts_choice(results)
    if not rows:
        faults = ", ".join(dict.fromkeys(r.fault for r in results))
        return [f"Under {faults}, no --nnodes {results[0].min_hosts}:{results[0].hosts} setting tried brought the "
                "other hosts back every time: see the table above and each trial's logs (torchrun's own).", ""]
    chosen = rows[0]
    defaults = {r.fault: r for r in results if not r.rdzv_conf}
    said = []
    for r in rows:
        default = defaults.get(r.fault)
        beside = ("" if default is None or default.setting == r.setting else
                  f" (torch's rendezvous defaults: {_seconds_or(default.back_s, 'not back')}, {default.outcome})")
        said.append(f"under {r.fault} the others went on as {r.world} host{'' if r.world == 1 else 's'}, every "
                    f"rank stepping again {r.back_s:.2f} s after the fault began{beside}")
    why = rdzv_conf_for(measured)[1] if chosen.rdzv_conf else "torch's rendezvous defaults (the faster settings did not bring it back)"
    restart = restart_choice(restarts)
    n = max_restarts_of(restart)[0] if restart else chosen.used
    env = _store_env(bool(restart and restart.own_store))
    conf = f" --rdzv-conf {_conf_text(chosen.rdzv_conf)}" if chosen.rdzv_conf else ""
    went_on = "; ".join(said)
    return [f"For a host gone for good: --nnodes {chosen.min_hosts}:{chosen.hosts}; {why}. "
            f"{went_on[0].upper()}{went_on[1:]}.",
            "", "```sh", f"{env}torchrun --nnodes {chosen.min_hosts}:{chosen.hosts} --max-restarts {n}{conf} ...",
            "```", ""]


def recommendation_text(f: Findings) -> str:
    """tune.md: the measurement, the candidates with their rules and evidence, the
    references measured beside them, the retry wave, what the settings do per fault, and
    the choice with the lines to paste."""
    measured, cands, evidence, chosen, references, transient, stopped_early, variant, hogs, waves = (
        f.measured, f.candidates, f.evidence, f.chosen, f.references, f.transient_s, f.stopped_early, f.variant,
        f.hogs, f.waves)
    busy = f" Every stage ran beside {hogs} busy CPU process(es) (--hogs {hogs}): a busy node." if hogs else ""
    out = ["# chaos tune", "", f"Fault-free: {measured.line()}.{busy}", ""]
    if stopped_early:
        out += [f"**Stopped early: {stopped_early}.** What follows is what the trials run so far show.", ""]
    out += ["## Candidates", "", "| candidate | timeout | false trips (controls) | transient "
            f"{transient:g} s absorbed | every rank knew of a silent rank | passes |", "|---|---|---|---|---|---|"]
    for c in cands:
        e = evidence.get(c.name, Evidence())
        absorbed = (f"{sum(1 for d in e.transient_detected if d == 0)} of {len(e.transient_detected)}"
                    if e.transient_detected else "not run")
        known = [t for t in e.silent_detected_s if not math.isnan(t)]
        detect = (f"median {statistics.median(known):.2f} s of {len(e.silent_detected_s)}" if known else
                  ("not every rank" if e.silent_detected_s else "not run"))
        out.append(f"| {c.name} | {c.timeout:g} s ({c.margin:g} x) | {sum(e.false_trips)} in "
                   f"{sum(e.control_s):.0f} s over {len(e.control_s)} controls | {absorbed} | {detect} | "
                   f"{'yes' if e.passes else 'no'} |")
    out += ["", "## Beside them, the same rank gone silent", "", "| setting | timeout | every rank knew | outcome |",
            "|---|---|---|---|"]
    if not references:
        out.append("| (not run: --no-references, or the budget ended first) | | | |")
    for r in references:
        known = f"{r.detect_s:.2f} s" if not math.isnan(r.detect_s) else f"not within the trial (hung >= {r.hang_cap_s:g} s cap)"
        setting = f"{r.timeout:g} s" if r.timeout is not None else "the job's own"
        out.append(f"| {r.name} | {setting} | {known} | {r.outcome} |")
    out += ["", *_wave_lines(waves), *_restart_lines(f.restarts), *_fault_lines(f.per_fault, chosen),
            *_hosts_lines(f.hosts), *_detector_lines(f), "## Recommended", ""]
    if chosen is None:
        out += ["No candidate passed: every one tripped in a fault-free control or detected a transient "
                "shorter than its timeout. Give the job a longer control (--control) or look at its slow steps."]
        return "\n".join(out) + "\n"
    c = next(c for c in cands if c.name == chosen)
    if variant is not None:
        how = (" ".join(variant["args"]) + " on its command line" if "args" in variant else
               ", ".join(f"{k}={v}" for k, v in variant["env"].items()) + " in its environment")
        return "\n".join(out + [
            f"`{c.name}`: " + "; ".join(c.rules) + ".", "", f"For your job: {how} (job.tune.timeout). In the "
            "script, that is the timeout of the process group its training collectives use:", "", "```python",
            "from datetime import timedelta", f"timeout = timedelta(seconds={c.timeout:g})",
            "dist.init_process_group(backend, timeout=timeout)  # or a group made for training after start-up",
            "```", "", "As a variant of the scenario:", "", "```yaml", "variants:",
            f"  {c.name}: {json.dumps(variant)}", "```", "", *_restart_choice_lines(f.restarts),
            *_hosts_choice_lines(f.hosts, f.restarts, f.measured)])
    jitter = wave_jitter(c, waves)
    if jitter != c.jitter:
        c = replace(c, jitter=jitter, rules=(*c.rules, f"jitter {jitter[0]:g}-{jitter[1]:g} s, the document's: "
                                                       "the narrower one's retry wave did not recover"))
    verdict = breaker_verdict(f.per_fault, c.name)
    breaker = bool(verdict and verdict[0])
    if verdict:
        c = replace(c, rules=(*c.rules, verdict[1]))
    detector = f.chosen_detector
    elastic = ([f"  {c.name}_elastic: {json.dumps(elastic_policy(c, detector, f.detector_interval_s))}"]
               if detector else [])
    out += [f"`{c.name}`: " + "; ".join(c.rules) + ".", "", *_detector_choice(f), "For the scenario:", "",
            "```yaml", "policies:", f"  {c.name}: {json.dumps(c.policy(breaker))}", *elastic, "```", "",
            "For your own job:", "", "```python",
            "from datetime import timedelta",
            f"dist.init_process_group(backend, timeout=timedelta(seconds={c.timeout:g}))",
            f"# retry a failed step up to {c.max_retries} times, waiting {c.backoff_base:g} s x 2^attempt "
            f"(at most {c.backoff_cap:g} s) + uniform({c.jitter[0]:g}, {c.jitter[1]:g}) s"
            + ("; when they run out or the\n# control plane cannot be reached, free what the rank holds and leave "
               "(the breaker)" if breaker else ""), "```", ""]
    return "\n".join(out) + "\n"


def write_tradeoff(path: Path, f: Findings) -> None:
    """The picture: every rank's time to know of a silent rank against the margin over the
    longest fault-free step, per candidate (a cross where it tripped or missed a transient),
    with the document's and PyTorch's default as lines."""
    cands, evidence, references = f.candidates, f.evidence, f.references
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for c in cands:
        e = evidence.get(c.name)
        if e is None or not e.silent_detected_s:
            continue
        y = e.detect_s()
        ax.scatter([c.margin], [y if math.isfinite(y) else c.timeout], marker="o" if e.passes else "x",
                   color="tab:green" if e.passes else "tab:red", zorder=3)
        ax.annotate(f"{c.timeout:g} s", (c.margin, y if math.isfinite(y) else c.timeout),
                    textcoords="offset points", xytext=(5, 5), fontsize=8)
    for r in references:
        y = r.detect_s if not math.isnan(r.detect_s) else r.hang_cap_s
        ax.axhline(y, linestyle="--", color="tab:gray")
        ax.text(0.99, y, f"{r.name}: " + (f"{y:.1f} s" if not math.isnan(r.detect_s) else f">= {y:g} s (cap)"),
                transform=ax.get_yaxis_transform(), ha="right", va="bottom", fontsize=8)
    ax.set_xscale("log")
    margins = sorted({c.margin for c in cands})
    ax.set_xticks(margins, [f"{m:g}x" for m in margins])
    ax.minorticks_off()
    ax.set_xlabel("timeout as a multiple of the longest fault-free wait")
    ax.set_ylabel("every rank knew of a silent rank (s)")
    ax.set_title("chaos tune: detection against margin (o passes, x tripped or missed a transient)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _max_restarts_json(results: list[RestartResult]) -> dict[str, Any] | None:
    chosen = restart_choice(results)
    if chosen is None:
        return None
    n, rule = max_restarts_of(chosen)
    return {"max_restarts": n, "env": OWN_STORE_ENV if chosen.own_store else {}, "from": chosen.setting, "rule": rule}


def _min_hosts_json(results: list[HostsResult], measured: FaultFree) -> dict[str, Any] | None:
    rows = hosts_choice(results)
    if not rows:
        return None
    chosen = rows[0]
    return {"min_hosts": chosen.min_hosts, "rdzv_conf": chosen.rdzv_conf, "from": chosen.setting,
            "rule": rdzv_conf_for(measured)[1] if chosen.rdzv_conf else "torch's rendezvous defaults"}


def tune_json(f: Findings) -> str:
    verdict = breaker_verdict(f.per_fault, f.chosen) if f.chosen else None
    return json.dumps({"fault_free": asdict(f.measured), "candidates": [asdict(c) for c in f.candidates],
                       "evidence": {k: asdict(v) for k, v in f.evidence.items()}, "chosen": f.chosen,
                       "references": [asdict(r) for r in f.references], "waves": [asdict(w) for w in f.waves],
                       "per_fault": [asdict(r) for r in f.per_fault],
                       "breaker": None if verdict is None else {"recommended": verdict[0], "why": verdict[1]},
                       "warnings": flap_warnings(f.per_fault, f.chosen) if f.chosen else [],
                       "heartbeat_gaps": None if f.gaps is None else json.loads(f.gaps.to_json()),
                       "detectors": [asdict(d) for d in f.detectors],
                       "detector_evidence": {k: asdict(v) for k, v in f.detector_evidence.items()},
                       "detector": None if f.chosen_detector is None else f.chosen_detector.name,
                       "restarts": [asdict(r) for r in f.restarts],
                       "max_restarts": _max_restarts_json(f.restarts),
                       "hosts": [asdict(r) for r in f.hosts], "min_hosts": _min_hosts_json(f.hosts, f.measured),
                       "stopped_early": f.stopped_early}, indent=1, default=str)
