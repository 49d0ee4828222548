"""The trajectory invariant: after a fault, did training go on as it would have without it?

Every step event of the built-in workload carries the rank's loss on its batch of that
step. The run folder's reference.json (harness.job.reference) holds the loss a fault-free
run of the same workload, seed and world size records for every rank at every step. A
trial's losses are held against it, step by step, before the fault and after whatever the
policy did (a retry that formed the group again, a restore that replayed steps):

    matches       every loss the trial recorded is the reference's within its tolerance
    differs       a loss is not: the first such (rank, step, generation) is named with both
                  values; the job went on, but not as it would have without the fault
    changed       the policy changed the membership (an elastic group went on with fewer
                  ranks, a rank was let back in): the batches differ by design, so no loss
                  is judged after that; the largest gap after it is said, measured
    not observed  no reference (a user's job, a run on a GPU, a run folder before format
                  7) or no loss recorded

The reference sums each step's gradients in rank order, gloo's ring in another: the two
differ by a few units in a float's last place, and training carries that further step by
step (on the shipped workload the gap doubles every ~8 steps from step ~30: 1e-5 at 30,
1.2e-4 at 66). The reference is computed twice, in rank order and the other way round; the
gap between the two at a step (`spread`) tracks the gap to a real run's (measured equal
within 1e-5 over 72 steps), so a loss is judged within TOLERANCE (twenty times the 5-decimal
rounding of a step event) plus ORDER_MARGIN times that spread.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from runfolder.layout import REFERENCE_FILE

MATCHES, DIFFERS, CHANGED, NOT_OBSERVED = "matches", "differs", "changed", "not observed"
TOLERANCE = 1e-4
ORDER_MARGIN = 4.0


@dataclass(frozen=True)
class Reference:
    world: int
    losses: tuple[tuple[float, ...], ...]  # [rank][step]
    spread: tuple[float, ...] = ()         # [step]: the gap between two summation orders

    def tolerance(self, step: int) -> float:
        return TOLERANCE + ORDER_MARGIN * (self.spread[step] if step < len(self.spread) else 0.0)


@dataclass(frozen=True)
class TrajectoryVerdict:
    verdict: str
    detail: str
    compared: int = 0
    max_gap: float = math.nan


def read_reference(run_dir: Path) -> Reference | None:
    try:
        data = json.loads((Path(run_dir) / REFERENCE_FILE).read_text())
        return Reference(int(data["world"]), tuple(tuple(float(x) for x in rank) for rank in data["losses"]),
                         tuple(float(x) for x in data.get("spread", ())))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _membership_change(events: Iterable[Mapping[str, Any]], world: int) -> Mapping[str, Any] | None:
    """The first event at which the training group stopped being the full world."""
    for event in events:
        if event.get("kind") == "membership" and (int(event["world"]) != world or event.get("joined")):
            return event
        if event.get("kind") == "group_ready" and int(event["world"]) != world:
            return event
    return None


def _gap(gap: float) -> str:
    return "identical to 5 decimals" if gap == 0 else f"gap <= {gap:.1g}"


def check_trajectory(events: list[Mapping[str, Any]], reference: Reference | None) -> TrajectoryVerdict:
    if reference is None:
        return TrajectoryVerdict(NOT_OBSERVED, "no fault-free reference (a user's job, a GPU run or an older run)")
    ordered = sorted(events, key=lambda e: float(e.get("t", 0.0)))
    change = _membership_change(ordered, reference.world)
    t_change = float(change["t"]) if change is not None else math.inf
    compared, worst, after = 0, 0.0, 0.0
    for event in ordered:
        if event.get("kind") != "step" or event.get("loss") is None:
            continue
        rank, step, loss = int(event["rank"]), int(event["step"]), float(event["loss"])
        if rank >= reference.world or step >= len(reference.losses[rank]):
            continue
        gap = abs(loss - reference.losses[rank][step])
        if float(event["t"]) >= t_change:
            after = max(after, gap)
            continue
        compared += 1
        worst = max(worst, gap)
        if gap > reference.tolerance(step):
            return TrajectoryVerdict(
                DIFFERS, f"rank {rank}'s loss at step {step} (generation {int(event.get('gen') or 0)}) is "
                         f"{loss:.5f}, a fault-free run's {reference.losses[rank][step]:.5f} "
                         f"(gap {gap:.2g} > {reference.tolerance(step):.2g}, rounding's reach by then)",
                compared, worst)
    if not compared:
        return TrajectoryVerdict(NOT_OBSERVED, "no loss recorded")
    if change is not None:
        return TrajectoryVerdict(
            CHANGED, f"{compared} losses as a fault-free run's ({_gap(worst)}) until the group changed "
                     f"in generation {int(change['gen'])} ({change['kind']}: world {int(change['world'])} of "
                     f"{reference.world}); after it the batches differ by design: loss gap up to {after:.3g}",
            compared, worst)
    return TrajectoryVerdict(MATCHES, f"{compared} losses as a fault-free run's ({_gap(worst)})", compared, worst)
