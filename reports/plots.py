"""The run's pictures: the policies compared (one row per trial: its outcome, and its
detect, recover and breaker times as bars beside the document's claim for that policy; a
hung trial drawn as at least the cap), and the timeline of one trial: every rank's step
index over time around the faults, each fault's window shaded, its legend entry carrying
its own figures (the metrics' f<i>_* columns)."""
from __future__ import annotations

import io
import math
from typing import Any, Mapping

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure  # a bare Figure renders with Agg: no pyplot, no GUI state

from runfolder.events import (BACKOFF, BREAKER_OPEN, COLLECTIVE_ERROR, EXIT, FAULT_APPLIED, FAULT_REVERTED,
                              HANG_DETECTED, RANK_EXITED, RESTORED, RETRY, STEP, SUSPECT)

# event kind -> (marker, colour, legend label); drawn at the rank's step index at that time
MARKERS: dict[str, tuple[str, str, str]] = {
    COLLECTIVE_ERROR: ("x", "red", "detection (collective error)"),
    SUSPECT: ("x", "darkorange", "detection (suspect)"),
    BACKOFF: ("|", "grey", "backoff"),
    RETRY: ("^", "tab:blue", "retry"),
    RESTORED: ("o", "tab:green", "restored"),
    BREAKER_OPEN: ("X", "purple", "breaker open"),
    EXIT: ("s", "black", "rank exit"),
    RANK_EXITED: ("v", "saddlebrown", "process gone"),
}


def _step_at(steps: pd.DataFrame, t: float) -> float:
    """The rank's step index at time t: its last completed step (0 before any)."""
    times = steps["t"].to_numpy()
    i = int(np.searchsorted(times, t, side="right")) - 1
    return float(steps["step"].iloc[i]) if i >= 0 else 0.0


def timeline_figure(events: pd.DataFrame, title: str, metrics: Mapping[str, Any]) -> Figure:
    start = float(metrics.get("fault_start_t", math.nan))
    origin = start if not math.isnan(start) else (float(events["t"].min()) if len(events) else 0.0)
    fig = Figure(figsize=(11, 5.5), layout="constrained")
    ax = fig.subplots()
    ranked = events[events["rank"].notna()]
    steps = ranked[ranked["kind"] == STEP]
    ranks = sorted(int(r) for r in ranked["rank"].unique())
    colours = {r: colormaps["viridis"](i / max(1, len(ranks) - 1)) for i, r in enumerate(ranks)}
    steps_by_rank = {int(r): g for r, g in steps.groupby("rank")}
    last_seen = ranked.groupby("rank")["t"].max()
    for rank, own in steps_by_rank.items():
        # carry the last step to the rank's last event, so a stall shows as a flat line
        times = [*own["t"], max(float(last_seen[rank]), float(own["t"].iloc[-1]))]
        ax.plot([t - origin for t in times], [*own["step"], own["step"].iloc[-1]],
                drawstyle="steps-post", lw=0.9, color=colours[rank])
    for kind, (marker, colour, label) in MARKERS.items():
        found = ranked[ranked["kind"] == kind]
        if not len(found):
            continue
        ys = [_step_at(steps_by_rank[int(r)], t) if int(r) in steps_by_rank else 0.0
              for r, t in zip(found["rank"], found["t"], strict=True)]
        ax.scatter(found["t"] - origin, ys, marker=marker, color=colour, label=label, s=40, zorder=3)
    _mark_harness(ax, events, origin, metrics)
    ax.set_xlabel("seconds since fault start" if not math.isnan(start) else "seconds since first event")
    ax.set_ylabel("step (one line per rank)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=8)
    return fig


def _fault_spans(events: pd.DataFrame) -> list[tuple[int, str, float, float, bool]]:
    """(index, fault kind, applied, reverted, at teardown) of each fault; reverted is NaN for
    one never taken off."""
    def index(row: pd.Series) -> int:
        return int(row.get("index", 0))  # a float in a frame whose other rows lack it
    reverted = {index(r): (float(r["t"]), r.get("teardown") is True)
                for _, r in events[events["kind"] == FAULT_REVERTED].iterrows()}
    return [(index(r), str(r.get("fault_kind", "")), float(r["t"]), *reverted.get(index(r), (math.nan, False)))
            for _, r in events[events["kind"] == FAULT_APPLIED].iterrows()]


def fault_label(index: int, kind: str, metrics: Mapping[str, Any]) -> str:
    """The fault's index, kind and its own figures: "#1 loss: detect 0.4 s, recover 3.1 s"."""
    figures = []
    for column, name in (("ttd_s", "detect"), ("ttr_s", "recover"), ("breaker_open_s", "breaker")):
        value = metrics.get(f"f{index}_{column}")
        if isinstance(value, (int, float)) and not math.isnan(value):
            figures.append(f"{name} {value:.1f} s")
    return f"#{index} {kind}" + (f": {', '.join(figures)}" if figures else "")


def _mark_harness(ax: Any, events: pd.DataFrame, origin: float, metrics: Mapping[str, Any]) -> None:
    last = float(events["t"].max()) - origin if len(events) else 0.0
    for index, kind, applied, reverted, at_teardown in _fault_spans(events):
        label = fault_label(index, kind, metrics)
        if not math.isnan(reverted):  # lighter when it lasted until the harness tore down
            label = f"{label} (until teardown)" if at_teardown else label
            ax.axvspan(applied - origin, reverted - origin, color="red", alpha=0.06 if at_teardown else 0.12,
                       label=label)
        elif kind == "kill":  # instantaneous: no window to shade
            ax.axvline(applied - origin, color="red", lw=1.5, label=label)
        else:  # still applied when the trial ended
            ax.axvspan(applied - origin, last, color="red", alpha=0.06, label=label)
    for _, hang in events[events["kind"] == HANG_DETECTED].iterrows():
        ax.axvline(float(hang["t"]) - origin, color="black", ls="--", lw=1,
                   label=f"hang detected (cap {hang.get('cap', '?')} s)")


def timeline_png(events: pd.DataFrame, title: str, metrics: Mapping[str, Any]) -> bytes:
    buffer = io.BytesIO()
    timeline_figure(events, title, metrics).savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


# (column, label, colour) of the bars of the comparison, in this order within a trial's row
COMPARED = (("ttd_s", "detect", "tab:orange"), ("ttr_s", "recover", "tab:green"),
            ("breaker_open_s", "breaker open", "tab:purple"))
SHORTEST_S = 0.01  # the log axis' floor: a detection within 10 ms is drawn at it


def _number(row: Mapping[str, Any], column: str) -> float:
    value = row.get(column)
    return float(value) if isinstance(value, (int, float)) and not pd.isna(value) else math.nan


def comparison_figure(df: pd.DataFrame, claims: Mapping[str, tuple[str, float, str]]) -> Figure:
    """One row per trial: its measured detect / recover / breaker times as bars (log
    seconds), a hung trial as a hatched bar to the cap labelled ">= cap", and the document's
    claim for the trial's policy as a black diamond on the matching bar (`claims`: policy ->
    (column, seconds, text); a claim past the axis is written at its right edge)."""
    rows = list(df.to_dict("records"))
    fig = Figure(figsize=(11, 1.2 + 0.75 * len(rows)), layout="constrained")
    ax = fig.subplots()
    height = 0.8 / len(COMPARED)
    longest = max([_number(r, c) for r in rows for c, _, _ in COMPARED] + [_number(r, "hung_cap") for r in rows]
                  + [1.0], key=lambda v: -math.inf if math.isnan(v) else v)
    right = longest * 30  # room right of the longest bar for its label and a claim past the axis
    labelled: set[str] = set()
    for y, row in enumerate(rows):
        for k, (column, label, colour) in enumerate(COMPARED):
            value = _number(row, column)
            offset = y - 0.4 + height * (k + 0.5)
            if not math.isnan(value):
                ax.barh(offset, max(value, SHORTEST_S), height=height, color=colour,
                        label=None if label in labelled else label)
                ax.text(max(value, SHORTEST_S) * 1.05, offset, f"{value:.2f} s", va="center", fontsize=7)
                labelled.add(label)
        if row.get("outcome") == "hung":
            cap = _number(row, "hung_cap")
            ax.barh(y, cap, height=0.8, fill=False, hatch="//", edgecolor="tab:red",
                    label=None if "hung" in labelled else "hung: at least the cap")
            ax.text(cap * 1.05, y, f">= {cap:g} s (cap)", va="center", fontsize=8, color="tab:red")
            labelled.add("hung")
        claim = claims.get(str(row.get("policy_base") or row.get("policy") or row.get("trial")))
        if claim is not None:
            column, seconds, text = claim
            k = next((i for i, (c, _, _) in enumerate(COMPARED) if c == column), None)
            at = y if k is None else y - 0.4 + height * (k + 0.5)
            ax.scatter([min(seconds, right)], [at], marker="D", color="black", zorder=4,
                       label=None if "claim" in labelled else "the document's claim")
            labelled.add("claim")
            if seconds > right:
                ax.text(right, at, f"document: {text} >", va="center", ha="right", fontsize=7)
    ax.set_yticks(range(len(rows)), [f"{r.get('trial')}\n{r.get('outcome')}" for r in rows], fontsize=9)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(SHORTEST_S * 0.8, right)
    ax.set_xlabel("seconds from the fault's start (log)")
    ax.set_title("The policies compared: measured times, and the document's claim for each policy")
    ax.grid(axis="x", alpha=0.3)
    if labelled:  # beside the plot, where no row's bars run
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return fig


def comparison_png(df: pd.DataFrame, claims: Mapping[str, tuple[str, float, str]]) -> bytes:
    buffer = io.BytesIO()
    comparison_figure(df, claims).savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()
