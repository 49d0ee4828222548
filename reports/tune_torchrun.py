"""`chaos tune` for a user's job under torchrun (job.tune.max_restarts: torchrun): the
restarts its agents spend on one fault episode and the --max-restarts derived from them,
and, for a host gone for good, --nnodes MIN:MAX with the --rdzv-conf derived from the
fault-free measurement (the rules `restarts` and `hosts` of reports.tune's list)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from reports.tune import CAME_BACK, FaultFree


# -- torchrun's restarts ---------------------------------------------------------------------

RESTART_EPISODES = 3      # fault episodes a run rides out by restarting: torchrun's default before 1.10
RESTART_EXTRA_S = 3.0     # the pause outlasts the timeout by this: every collective times out, every agent restarts
# torchrun's workers meet on the rendezvous's own store by default, their keys told apart by
# each agent's own restart count, which agents that restarted for different reasons do not
# share (pytorch/pytorch#135712, #108158); with this set, each round's workers get a store of their own
OWN_STORE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass(frozen=True)
class RestartResult:
    """The job under torchrun with one --max-restarts, after a pause longer than its timeout
    (times from the fault's start; nan: not observed)."""

    setting: str
    max_restarts: int
    own_store: bool           # OWN_STORE_ENV set
    outcome: str
    used: int                 # the most restarts one host's agent made (its worker processes begun after the fault)
    back_s: float             # every rank stepping again (TTR)
    wasted_rank_s: float
    hang_cap_s: float
    stuck_in: str = ""        # a hung trial: where each process was at the cap (reports.stuck)


def restarts_used(events: Iterable[dict[str, Any]], since: float) -> int:
    """The most restarts one rank's agent spent at or after `since`: the rise in torchrun's
    restart count its processes began with (rank_start `restart`; an agent that restarts
    for a host that joined spends none), or where that is not recorded (run folder format
    11 and before) the processes it began, each restart starting every worker of the host."""
    before: dict[int, int] = {}
    after: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("kind") == "rank_start":
            rank = int(e["rank"])
            if float(e["t"]) >= since:
                after.setdefault(rank, []).append(e)
            elif e.get("restart") is not None:
                before[rank] = max(before.get(rank, 0), int(e["restart"]))
    spent = [max(int(e["restart"]) for e in starts) - before.get(rank, 0)
             if all(e.get("restart") is not None for e in starts) else len(starts) for rank, starts in after.items()]
    return max(spent, default=0)


def restart_choice(results: Iterable[RestartResult]) -> RestartResult | None:
    """Of the sides with restarts that brought every rank back, torch's own store first (no
    environment to set), then the soonest back."""
    back = [r for r in results if r.max_restarts and r.outcome in CAME_BACK]
    return min(back, key=lambda r: (r.own_store, r.back_s)) if back else None


def max_restarts_of(r: RestartResult) -> tuple[int, str]:
    """--max-restarts and its rule: an agent's restarts per episode (measured) times RESTART_EPISODES."""
    per_episode = max(r.used, 1)
    n = per_episode * RESTART_EPISODES
    return n, (f"--max-restarts {n}: {RESTART_EPISODES} fault episodes a run rides out (torchrun's default before "
               f"1.10) x {per_episode} restart(s) the most-restarted agent made for one (measured: a pause "
               f"{RESTART_EXTRA_S:g} s longer than the timeout); torchrun counts restarts per agent and never "
               "gives one back" + ("" if n == r.max_restarts else f" (the trial ran --max-restarts {r.max_restarts})"))


# -- a host gone for good ---------------------------------------------------------------------

MIN_HOSTS_SUFFIX = "_min_hosts"              # torchrun --nnodes N-1:N with the rendezvous settings derived below
TORCH_RDZV_SUFFIX = "_min_hosts_torch_rdzv"  # the same with torch's rendezvous defaults (a reference)
# torch's c10d rendezvous (dynamic_rendezvous.create_handler): an agent that stops writing its
# keep-alive is dropped interval x attempts after its last one; once the fewest hosts allowed
# have joined, the rendezvous waits last_call for more before it closes
TORCH_RDZV = {"keep_alive_interval": 5, "keep_alive_max_attempt": 3, "last_call_timeout": 30}
KEEP_ALIVE_S = 1         # the smallest --rdzv-conf takes (whole seconds)
MIN_LAST_CALL_S = 2


def rdzv_wait_s(conf: dict[str, int]) -> float:
    """How long a rendezvous waits for a host that is gone before it closes without it."""
    merged = {**TORCH_RDZV, **conf}
    return merged["keep_alive_interval"] * merged["keep_alive_max_attempt"] + merged["last_call_timeout"]


def rdzv_conf_for(measured: FaultFree) -> tuple[dict[str, int], str]:
    """--rdzv-conf for a job that goes on without a host, and its rule."""
    wait = max(measured.max_s, measured.step_period_s)
    last_call = max(MIN_LAST_CALL_S, math.ceil(2 * wait))
    attempts = TORCH_RDZV["keep_alive_max_attempt"]
    return ({"keep_alive_interval": KEEP_ALIVE_S, "last_call_timeout": last_call},
            f"keep_alive_interval {KEEP_ALIVE_S} s: a gone agent is dropped {KEEP_ALIVE_S * attempts} s "
            f"({attempts} missed keep-alives, torch's count) after its last one, not "
            f"{TORCH_RDZV['keep_alive_interval'] * attempts} s; last_call_timeout {last_call} s: twice the longest "
            f"fault-free wait ({wait:.3f} s), whole seconds, at least {MIN_LAST_CALL_S} s (the survivors fail "
            "within a step of each other and their agents see it within 0.1 s; one later than the last call "
            f"is not lost, it costs another restart), not {TORCH_RDZV['last_call_timeout']} s")


@dataclass(frozen=True)
class HostsResult:
    """The job under torchrun with --nnodes MIN:MAX after a host went for good (times from
    the fault's start; nan: not observed)."""

    fault: str
    setting: str
    min_hosts: int
    hosts: int
    rdzv_conf: dict[str, int]  # --rdzv-conf ({}: torch's defaults)
    outcome: str
    world: int | None          # the hosts in the last group formed after the fault
    used: int                  # the most restarts one agent made
    back_s: float              # every survivor stepping again (TTR)
    wasted_rank_s: float
    hang_cap_s: float
    stuck_in: str = ""


def hosts_choice(results: Iterable[HostsResult]) -> tuple[HostsResult, ...]:
    """The rows of the setting that went on without the host under every fault tried, the
    soonest back under its slowest fault (empty: no setting did)."""
    by_setting: dict[str, list[HostsResult]] = {}
    for r in results:
        by_setting.setdefault(r.setting, []).append(r)
    back = [tuple(rows) for rows in by_setting.values() if all(r.outcome in CAME_BACK for r in rows)]
    return min(back, key=lambda rows: max(r.back_s for r in rows), default=())
