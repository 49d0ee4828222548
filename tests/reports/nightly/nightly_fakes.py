"""Synthetic nights for the nightly tests: rows shaped like reports.analyze_run's, grouped
into runs (one per repeat) and nights, with figures drawn from a seeded RNG."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from reports.nightly import History, NightInfo, NightRun, append_night, night_history

COMMAND = "chaos run scenarios/loss_20pct.yaml --backend netns --seed 1"
NAN = math.nan


def trial(scenario: str = "loss_20pct", policy: str = "retry", outcome: str = "recovered", seed: int = 1,
          fault: str = "loss", base: str | None = None, **figures: Any) -> dict[str, Any]:
    """One analyze_run row; metrics not given are NaN (they did not apply)."""
    return {"run": f"{scenario}-{seed}", "scenario": scenario, "seed": seed, "trial": policy, "policy": policy,
            "policy_base": base or policy, "fault": fault, "outcome": outcome, "outcome_reason": f"{outcome} (fake)",
            "hung_cap": figures.pop("hung_cap", NAN), "timeout_s": figures.pop("timeout_s", 5.0),
            "expect": figures.pop("expect", ""), "expect_failures": figures.pop("expect_failures", ""),
            "state": figures.pop("state", "consistent"), "state_detail": figures.pop("state_detail", "state consistent"),
            "ttd_s": NAN, "ttr_s": NAN, "breaker_open_s": NAN, **figures}


def info(index: int, loop_ns: float | None = None, wake_us: float | None = None,
         fault_us: float | None = None) -> NightInfo:
    """Night `index`: 2025-01-(index+1), started at 02:00 UTC."""
    day = f"2025-01-{index + 1:02d}"
    return NightInfo(night=day, started=f"{day}T02:00:00+00:00", commit=f"c{index:03d}", host="gpu-node-1",
                     kernel="6.8.0", torch="2.13.0", cuda="12.4", gpu="H200", driver="550.54", nccl="2.21.5",
                     backend="netns", loop_ns=loop_ns, wake_us=wake_us, fault_us=fault_us)


def night(index: int, repeats: list[list[dict[str, Any]]], **machine: float | None) -> History:
    """A night whose repeat r ran the trials repeats[r] (one run folder per repeat)."""
    return night_history(info(index, **machine),
                         [NightRun(r, COMMAND, pd.DataFrame(rows)) for r, rows in enumerate(repeats)])


def usual_repeats(rng: np.random.Generator, repeats: int = 5, ttr: float = 12.0, ttd: float = 5.2,
                  retry_outcome: str = "recovered") -> list[list[dict[str, Any]]]:
    """retry recovers in ~ttr s (sd 0.5), timeout fails fast in ~ttd s (sd 0.05), seeds 100+r."""
    out = []
    for r in range(repeats):
        retry = (trial(policy="retry", seed=100 + r, outcome=retry_outcome, ttd_s=rng.normal(5.2, 0.05),
                       ttr_s=rng.normal(ttr, 0.5), steps_per_s_after=rng.normal(4.0, 0.1))
                 if retry_outcome == "recovered" else
                 trial(policy="retry", seed=100 + r, outcome=retry_outcome, hung_cap=30.0))
        timeout = trial(policy="timeout", seed=100 + r, outcome="failed-fast", ttd_s=rng.normal(ttd, 0.05))
        out.append([timeout, retry])
    return out


def seed_history(db: Path, rng: np.random.Generator, nights: int = 10) -> None:
    """`nights` usual nights appended to the database at `db`."""
    for index in range(nights):
        append_night(db, night(index, usual_repeats(rng)))
