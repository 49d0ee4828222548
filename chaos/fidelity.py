"""What `chaos calibrate` is made of: a Figure (one fault, configured against measured, with
its verdict) and a Family (the kinds measured on one scratch setting: the network kinds
between two scratch hosts, chaos.calibrate; the storage kinds in a scratch folder under the
FUSE passthrough, chaos.calibrate_storage; `slow` on a busy process, chaos.calibrate_slow).
A new calibrated kind is a spec and a measurer in its family's module; chaos.calibrate
lists the families."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

from chaos.api import Host
from chaos.faults import FaultBase
from chaos.inject import NetlinkInjector
from chaos.ledger import Ledger
from chaos.mechanism import Unavailable
from chaos.undo import UNDOS, record_owner, undo_outstanding


@dataclass(frozen=True)
class Figure:
    fault: str
    mechanism: str
    configured: str
    measured: str
    ok: bool | None  # None: this machine's mechanism cannot give the fault (said, not measured),
                     # or it was too busy to judge it (said, with why)


@dataclass(frozen=True)
class Family:
    """Kinds measured on one scratch setting: `scratch(run_id, ledger)` makes it (and
    removes it on the way out), `measure(setting, spec)` gives one spec's Figure."""

    specs: tuple[dict[str, Any], ...]
    scratch: Callable[[str, Ledger], ContextManager[Any]]
    measure: Callable[[Any, dict[str, Any]], Figure]

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(spec["kind"] for spec in self.specs))


@contextlib.contextmanager
def owned(ledger: Ledger) -> Iterator[None]:
    """The ledger names this process as the run's owner (a concurrent heal leaves it alone);
    whatever a measurement left outstanding is undone on the way out."""
    record_owner(ledger)
    try:
        yield
    finally:
        undo_outstanding(ledger, UNDOS)
        ledger.close_if_clean()


def not_measured(injector: NetlinkInjector, fault: FaultBase, host: Host, why: str = "") -> Figure | None:
    """The figure that says why this machine's mechanism cannot give `fault` on `host`
    (a refusal, or a fallback's limit), or None where it can. `why` leads the reason."""
    chosen = injector.mechanisms[fault.kind]  # type: ignore[attr-defined]
    reason = chosen.reason if isinstance(chosen, Unavailable) else chosen.conflict(fault, host)
    if not reason:
        return None
    return Figure(fault.describe(), injector.mechanism(fault), "-", f"not measured: {why}{reason}", None)
