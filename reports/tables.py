"""The comparison table that mirrors the source document's, measured instead of claimed.

One row per trial: policy | fault | what happened (measured, in the document's words) |
measured time | the document's claim for that policy | whether the claim held, and why.
Its figures are those of the first fault; a timeline of several faults adds a table with
one row per fault (`fault_rows`). An incomplete trial is not judged.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

import pandas as pd


@dataclass(frozen=True)
class Claim:
    """One row of the source document's table."""

    text: str
    fault: str               # the fault the document used
    fault_kinds: tuple[str, ...]  # our fault kinds that match it (substring match)
    outcome: str             # the outcome the row describes, in our words
    column: str | None       # the metric its figure is about
    figure_s: float
    figure_text: str


HOUR = 3600.0
DOCUMENT_CLAIMS: dict[str, Claim] = {
    "baseline": Claim("one node loses packets -> whole cluster deadlocks -> stuck ~5.2 hours",
                      "20% packet loss", ("loss",), "hung", None, 5.2 * HOUR, "stuck ~5.2 h"),
    "timeout": Claim("packet loss -> noticed in 15 s -> infinite wait interrupted",
                     "20% packet loss", ("loss",), "failed-fast", "ttd_s", 15.0, "detect 15 s"),
    "retry": Claim("packet loss -> backoff retry -> communication restored within 12 s",
                   "20% packet loss", ("loss",), "recovered", "ttr_s", 12.0, "recover <= 12 s"),
    "isolation": Claim("node physically unplugged -> breaker opens in 30 s -> GPUs handed back "
                       "to the scheduler", "node unplugged", ("link_down", "unplug"), "isolated",
                       "breaker_open_s", 30.0, "breaker 30 s"),
}
def claim_marks() -> dict[str, tuple[str, float, str]]:
    """Per policy, the document's claim as the comparison picture marks it: (the metric its
    figure is about, its seconds, its words); the baseline's hang is about no metric."""
    return {policy: (claim.column or "", claim.figure_s, claim.figure_text) for policy, claim in DOCUMENT_CLAIMS.items()}


TABLE_COLUMNS = ("policy", "fault", "what happened (measured)", "measured time", "state",
                 "document's claim", "claim held?", "expectations")


def _num(row: Mapping[str, Any], column: str) -> float:
    try:
        return float(row.get(column))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _s(value: float) -> str:
    return f"{value:.1f} s"


def fault_text(row: Mapping[str, Any]) -> str:
    kind = str(row.get("fault") or "no fault")
    targets = str(row.get("fault_targets") or "").split()
    text = kind + (" on " + ", ".join(f"r{t}" for t in targets) if targets else "")
    if reaches := str(row.get("fault_reaches") or "").split():
        text += f" (reaches {', '.join(f'r{r}' for r in reaches)} too)"
    duration = _num(row, "fault_duration_s")
    if not math.isnan(duration):
        text += f" for {_s(duration)}"
    extra = len(str(row.get("faults") or "").split(";")) - 1
    return text + (f" (+{extra} more)" if extra > 0 else "")


def _fault_windows(row: Mapping[str, Any]) -> list[tuple[float, str]]:
    """(start, "the link_down on r7, r11") of each applied fault, by start: a fault's
    window runs from its start to the next one's. Times are after the first fault's start."""
    windows = []
    for i in fault_indices(row):
        start = _num(row, f"f{i}_start_s")
        if not math.isnan(start):
            targets = ", ".join(f"r{t}" for t in str(row.get(f"f{i}_targets") or "").split())
            windows.append((start, f"{targets} {row.get(f'f{i}_fault')}".strip()))
    return sorted(windows)


def _window_of(windows: list[tuple[float, str]], t: float) -> int:
    return max((i for i, (start, _) in enumerate(windows) if start <= t + 1e-9), default=0)


def _lead(row: Mapping[str, Any]) -> tuple[list[tuple[float, str]], int]:
    """The faults' windows, and the one the story leads with: the one the first detection
    fell in (a fault no rank noticed does not get a later fault's detection)."""
    windows = _fault_windows(row)
    ttd = _num(row, "ttd_s")
    return windows, (_window_of(windows, ttd) if len(windows) > 1 and not math.isnan(ttd) else 0)


def _at(row: Mapping[str, Any], column: str) -> str:
    """A time of the story, after the start of the fault it leads with; one that fell in a
    later fault's window also says how long after that fault's start."""
    t = _num(row, column)
    windows, lead = _lead(row)
    if math.isnan(t) or len(windows) < 2:
        return _s(t)
    text = _s(t - windows[lead][0])
    if (own := _window_of(windows, t)) != lead:
        start, name = windows[own]
        text += f" ({_s(t - start)} after {name} at +{_s(start)})"
    return text


def _detection_text(row: Mapping[str, Any]) -> str:
    detected = 0.0 if math.isnan(_num(row, "detect_ranks")) else _num(row, "detect_ranks")
    coordinator = str(row.get("detect_coordinator")).lower() == "true"  # a bool, or its text from a csv
    if detected == 0 and not coordinator:
        return "no rank detects it"
    windows, lead = _lead(row)
    shift = windows[lead][0] if windows else 0.0
    first, last = _num(row, "ttd_s") - shift, _num(row, "ttd_max_s") - shift
    when = _s(first) if last - first < 0.05 else f"{first:.1f}-{last:.1f} s"
    ranks = int(_num(row, "ranks"))
    cause = row.get("detect_cause") or "error"
    who = (f"{detected:.0f}/{ranks} ranks" + (" and the coordinator" if coordinator else "") + " detect"
           if detected else "the coordinator detects")
    return f"{who} at {when} ({cause}, first r{row.get('detect_first_rank')})"


def _retries(row: Mapping[str, Any]) -> str:
    retries = _num(row, "retries")
    return f"{retries:.0f} retries -> " if retries > 0 else ""


def _outcome_text(row: Mapping[str, Any]) -> str:
    outcome = row.get("outcome")
    if outcome == "hung":
        return f"no progress -> hung >= {_num(row, 'hung_cap'):g} s (harness cap)"
    if outcome in ("failed-fast", "retries-exhausted"):
        return f"{_retries(row)}exit {outcome} by {_at(row, 'released_s')}"
    if outcome == "isolated":
        released = _num(row, "released_s")
        gone = f" -> resources released by {_at(row, 'released_s')}" if not math.isnan(released) else ""
        return f"{_retries(row)}breaker opens at {_at(row, 'breaker_open_s')}{gone}{_gpu_released(row)}"
    if outcome == "recovered":
        rejoined = _num(row, "rejoined_ranks")
        back = (f"{rejoined:.0f} left out, let back in at {_at(row, 'rejoined_s')} -> "
                if rejoined > 0 else "")
        return f"{_retries(row)}{back}all ranks step again at {_at(row, 'ttr_s')}"
    if outcome == "continued":
        return f"survivors go on as a world of {row.get('final_world')} at {_at(row, 'ttr_s')}"
    if outcome == "absorbed":
        before, during = _num(row, "steps_per_s_before"), _num(row, "steps_per_s_during")
        pace = (f"; {during:.2f} steps/s during the fault, {before:.2f} before: {during / before:.2f}x"
                if before > 0 and not math.isnan(during) else "")
        return f"training goes on (longest stall {_s(_num(row, 'max_stall_s'))}{pace})"
    return f"{outcome}: {row.get('outcome_reason', '')}"


def _gpu_released(row: Mapping[str, Any]) -> str:
    """Beside the breaker: GPU memory back to the bar of 512 MiB, per process (NVML)."""
    secs = _num(row, "gpu_released_s")
    if math.isnan(secs):
        return "; GPU memory released: not observed"
    verdict = "within" if row.get("gpu_release_within_bar") else "over"
    return f"; GPU memory <= 512 MiB {_s(secs)} after the breaker ({verdict} the 50 s bar)"


def _gpu_freed(row: Mapping[str, Any]) -> str:
    """Beside a kill: the killed process's GPU memory gone, per process (NVML)."""
    secs = _num(row, "gpu_freed_after_kill_s")
    if math.isnan(secs):
        return " (GPU memory freed: not observed)"
    return f" (its GPU memory gone {secs:.2f} s after the kill)"


def state_text(row: Mapping[str, Any]) -> str:
    """The state column: the checker's verdict (reports.state); 'not observed' when absent."""
    return str(row.get("state") or "not observed")


def what_happened(row: Mapping[str, Any]) -> str:
    """The measured story of a trial in the document's style: fault -> detection -> outcome,
    led by the state verdict when the job came back wrong, and by the trajectory when it
    went on otherwise than without the fault."""
    lead = f"{row.get('state_detail')} | " if row.get("state") == "diverged" else ""
    if row.get("trajectory") == "differs":  # reports.trajectory: it went on, not as without the fault
        lead += f"trajectory: {row.get('trajectory_detail')} | "
    stuck = f" | stuck in: {row.get('stuck_in')}" if row.get("stuck_in") else ""
    notes = "".join(f" | {prefix}{text}" for prefix, column in (("", "not_applied"), ("checkpoint: ", "checkpoints"))
                    if isinstance(text := row.get(column), str) and text)
    return lead + _story(row) + stuck + notes


def _story(row: Mapping[str, Any]) -> str:
    targets = " ".join(f"r{t}" for t in str(row.get("fault_targets") or "").split())
    parts = [f"{targets} {row.get('fault')}".strip() if row.get("fault") else "no fault"]
    windows, lead = _lead(row)
    if lead > 0:  # the first faults went unnoticed: the story goes on from the one detected
        parts[0] += f": no rank detects it; {windows[lead][1]} at +{_s(windows[lead][0])}"
    if row.get("fault") == "kill":
        parts[0] += _gpu_freed(row)
    if row.get("outcome") != "no-fault":
        parts.append(_detection_text(row))
    if row.get("outcome") == "crashed":
        cause = row.get("crash_cause")
        parts.append(str(row.get("outcome_reason")) + (f"; the log: {cause}" if cause else ""))
    else:
        parts.append(_outcome_text(row))
    return " -> ".join(parts) + _host_drops(row) + _steal(row)


def _host_drops(row: Mapping[str, Any]) -> str:
    """A loss no fault injected, said where the kernel counted one (docs/scale.md)."""
    packets = _num(row, "host_backlog_drops")
    if math.isnan(packets) or packets <= 0:
        return ""
    return f" (the host's kernel dropped {packets:.0f} packets of its own: receive backlog full)"


# Said where the VM's host took at least this share of the CPU time: far above a quiet
# hour's, yet below what a slow hour's trials saw (docs/performance.md: 0.3-36.6%).
STEAL_SAID = 0.05


def _steal(row: Mapping[str, Any]) -> str:
    """A slowness no fault injected, said where the VM's host took a share worth saying."""
    share = _num(row, "host_steal_share")
    if math.isnan(share) or share < STEAL_SAID:
        return ""
    return f" (the VM's host took {share:.0%} of this machine's CPU time meanwhile: steal)"


def measured_time(row: Mapping[str, Any]) -> str:
    """The one number the outcome is about; a hang shows its cap, never a made-up figure."""
    outcome = row.get("outcome")
    pick = {"hung": None, "failed-fast": "ttd_s", "retries-exhausted": "ttd_s", "crashed": "ttd_s",
            "exited-clean": "ttd_s", "preempted": "ttd_s",
            "recovered": "ttr_s", "continued": "ttr_s", "isolated": "breaker_open_s",
            "absorbed": "max_stall_s"}
    if outcome == "hung":
        return f">= {_num(row, 'hung_cap'):g} s (hung)"
    column = pick.get(str(outcome))
    value = _num(row, column) if column else math.nan
    if math.isnan(value):
        return "-"
    label = {"ttd_s": "detect", "ttr_s": "recover", "breaker_open_s": "breaker",
             "max_stall_s": "stall"}[column]  # type: ignore[index]
    return f"{label} {_s(value)}"


def claim_for(row: Mapping[str, Any]) -> Claim | None:
    return DOCUMENT_CLAIMS.get(str(row.get("policy_base") or row.get("policy")))


def judge_claim(row: Mapping[str, Any]) -> tuple[str, str]:
    """(verdict, why): verdict is yes / no / partly, or "-" for a policy the document lacks."""
    claim = claim_for(row)
    if claim is None:
        return "-", "not in the document"
    outcome = row.get("outcome")
    if outcome == "incomplete":
        return "-", "not judged: the trial did not finish"
    notes = []
    if not any(k in str(row.get("fault", "")) for k in claim.fault_kinds):
        notes.append(f"the document's fault was {claim.fault}, this one {row.get('fault') or 'none'}")
    if outcome != claim.outcome:
        verdict, why = "no", f"{outcome} instead of {claim.outcome}"
    elif claim.column is None:  # the baseline: a hang, which the harness watches only up to its cap
        verdict = "partly"
        why = (f"hung >= {_num(row, 'hung_cap'):g} s cap: the document's {claim.figure_text} "
               "cannot be seen under the cap")
    else:
        value = _num(row, claim.column)
        held = value <= claim.figure_s
        verdict = "yes" if held else "no"
        why = f"{_s(value)} {'<=' if held else '>'} {claim.figure_s:g} s"
    timeout = _num(row, "timeout_s")
    if claim.column == "ttd_s" and not math.isnan(timeout):
        notes.append(f"policy timeout {timeout:g} s")
    if outcome == "isolated" and math.isnan(_num(row, "cuda_reserved_after")):
        notes.append("no accelerator: GPU memory release not measured")
    return verdict, "; ".join([why, *notes])


def expectation_text(row: Mapping[str, Any]) -> str:
    failures = row.get("expect_failures") or ""
    if row.get("outcome") == "incomplete":
        return "not judged: the trial did not finish"
    if failures:
        return f"FAILED: {failures}"
    return "met" if row.get("expect") else "none set"


def table_rows(df: pd.DataFrame) -> list[list[str]]:
    rows = []
    for _, row in df.iterrows():
        claim = claim_for(row)
        verdict, why = judge_claim(row)
        rows.append([str(row.get("policy")), fault_text(row), what_happened(row), measured_time(row),
                     state_text(row),
                     f"{claim.text} ({claim.figure_text})" if claim else "-",
                     f"{verdict}: {why}" if verdict != "-" else "-", expectation_text(row)])
    return rows


FAULT_COLUMNS = ("policy", "#", "fault", "starts", "detect", "recover", "breaker")


def fault_indices(row: Mapping[str, Any]) -> list[int]:
    """The indices of the faults that have f<i>_* columns in this row."""
    found = (re.fullmatch(r"f(\d+)_fault", str(column)) for column in row.keys())
    return sorted(int(m.group(1)) for m in found if m and isinstance(row.get(m.group(0)), str))


def _figure(row: Mapping[str, Any], column: str) -> str:
    value = _num(row, column)
    return "not observed" if math.isnan(value) else _s(value)


def fault_rows(df: pd.DataFrame) -> list[list[str]]:
    """One row per fault of every trial: its own detect / recover / breaker times, each after
    its own start; "not observed" where its window showed none."""
    rows = []
    for _, row in df.iterrows():
        for i in fault_indices(row):
            targets = ", ".join(f"r{t}" for t in str(row.get(f"f{i}_targets") or "").split())
            rows.append([str(row.get("policy")), str(i), f"{row.get(f'f{i}_fault')} on {targets}",
                         f"+{_s(_num(row, f'f{i}_start_s'))}", _figure(row, f"f{i}_ttd_s"),
                         _figure(row, f"f{i}_ttr_s"), _figure(row, f"f{i}_breaker_open_s")])
    return rows


def markdown_table(header: list[str] | tuple[str, ...], rows: list[list[str]]) -> str:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(cell(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def format_table(df: pd.DataFrame) -> str:
    """The comparison table (Markdown, readable as plain text) for the terminal and report.md;
    with a per-fault table below it when a trial had more than one fault."""
    table = markdown_table(TABLE_COLUMNS, table_rows(df))
    if several_faults(df):
        table += f"\n\n{EVERY_FAULT}:\n\n" + markdown_table(FAULT_COLUMNS, fault_rows(df))
    return table


EVERY_FAULT = "Every fault, each timed from its own start"


def several_faults(df: pd.DataFrame) -> bool:
    """Whether a trial had more than one fault (the reports then add the per-fault table)."""
    return any(len(fault_indices(row)) > 1 for _, row in df.iterrows())


def compare_table(runs: list[tuple[str, pd.DataFrame]]) -> str:
    """Several runs side by side: one row per policy and fault, one column per run."""
    keys: list[tuple[str, str]] = []
    cells: dict[tuple[str, str, str], str] = {}
    for label, df in runs:
        for _, row in df.iterrows():
            key = (str(row.get("policy")), str(row.get("fault") or "-"))
            if key not in keys:
                keys.append(key)
            cells[(*key, label)] = f"{row.get('outcome')}, {measured_time(row)}"
    header = ["policy", "fault", *(label for label, _ in runs)]
    rows = [[policy, fault, *(cells.get((policy, fault, label), "-") for label, _ in runs)]
            for policy, fault in keys]
    return markdown_table(header, rows)
