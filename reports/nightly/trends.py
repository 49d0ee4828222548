"""The trend page: per scenario, the outcomes of every policy night by night, and one plot
per metric with the median and interquartile band of each policy over the last nights.
Self-contained HTML: the plots are embedded as base64 PNG."""
from __future__ import annotations

import base64
import html
import io

import pandas as pd
from matplotlib.figure import Figure  # a bare Figure renders with Agg: no pyplot, no GUI state

from reports.nightly.history import NIGHTLY_METRICS, History, Metric
from reports.nightly.stats import counts, quartiles

TREND_NIGHTS = 30
_STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;margin:1em 0}"
          "td,th{border:1px solid #bbb;padding:4px 8px;text-align:left}th{background:#eee}img{max-width:100%}")


def trend_png(metric: Metric, scenario: str, values: pd.DataFrame, nights: tuple[str, ...]) -> bytes:
    """`values`: the metric's rows (policy, night, value) of one scenario."""
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    ax = fig.subplots()
    position = {night: i for i, night in enumerate(nights)}
    for policy, rows in values.groupby("policy", sort=False):
        per_night = [(position[night], quartiles(group["value"]))
                     for night, group in rows.groupby("night", sort=False)]
        per_night.sort(key=lambda item: item[0])
        xs = [x for x, _ in per_night]
        line, = ax.plot(xs, [q.median for _, q in per_night], marker="o", lw=1.2, label=f"{policy} (median)")
        ax.fill_between(xs, [q.q1 for _, q in per_night], [q.q3 for _, q in per_night],
                        color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xticks(range(len(nights)), nights, rotation=45, ha="right", fontsize=7)
    ax.set_xlim(-0.5, len(nights) - 0.5)
    ax.set_ylabel(f"{metric.label} ({metric.unit})")
    ax.set_title(f"{scenario}: {metric.label} (band: interquartile range over the repeats)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    return buffer.getvalue()


def _outcome_table(trials: pd.DataFrame, nights: tuple[str, ...]) -> str:
    table = {policy: {night: counts(group["outcome"]).text() for night, group in rows.groupby("night")}
             for policy, rows in trials.groupby("policy", sort=False)}
    frame = pd.DataFrame(table).T.reindex(columns=[n for n in nights if n in set(trials["night"])]).fillna("-")
    return frame.rename_axis("policy").reset_index().to_html(index=False, escape=True)


def trend_html(history: History, night: str, last: int = TREND_NIGHTS) -> str:
    """The trend page of the `last` nights of the history up to `night`."""
    nights = (*history.nights_before(night, last - 1), night)
    trials = history.trials[history.trials["night"].isin(nights)]
    metrics = history.metrics[history.metrics["night"].isin(nights)]
    shown = history.nights[history.nights["night"].isin(nights)].drop(columns="digest")
    title = f"Chaos nightly trends: {len(nights)} nights" + (f", {nights[0]} .. {nights[-1]}" if nights else "")
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
           shown.to_html(index=False, escape=True)]
    for scenario, rows in trials.groupby("scenario", sort=False):
        out += [f"<h2>{html.escape(str(scenario))}</h2>", "<h3>Outcomes</h3>", _outcome_table(rows, nights)]
        own = metrics[metrics["scenario"] == scenario]
        for metric in NIGHTLY_METRICS:
            values = own[own["metric"] == metric.column]
            if len(values):
                data = base64.b64encode(trend_png(metric, str(scenario), values, nights)).decode()
                out.append(f"<img alt='{html.escape(f'{scenario}: {metric.label}')}' "
                           f"src='data:image/png;base64,{data}'>")
    out.append("</body></html>")
    return "\n".join(out)
