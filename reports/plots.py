"""Timeline plot of one trial: every rank's step index over time around the faults; each
fault's window is shaded, its legend entry carrying its own figures (the metrics' f<i>_*
columns)."""
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
