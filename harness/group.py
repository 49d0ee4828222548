"""The torch.distributed edge: a gloo process group that can be left and re-joined.

torch raises plain RuntimeErrors (and DistError subclasses) for every collective failure;
they are translated once, here, into `CollectiveError` with a short classification.
Collectives are issued asynchronously and waited on by polling, so that a SIGTERM (and a
failure detector) is noticed within one poll interval instead of only at the timeout.
"""
from __future__ import annotations

import gc
import re
import socket
import time
from datetime import timedelta
from typing import Callable, Protocol

import torch
import torch.distributed as dist

from harness.control import GENERATION_KEY

POLL_INTERVAL_S = 0.005
RENDEZVOUS_SLICE_S = 0.5
RENDEZVOUS_REPORT_S = 5.0
_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


class CollectiveError(Exception):
    """A collective or a rendezvous failed. `cause` is timeout / closed / reset / rendezvous / other."""

    def __init__(self, message: str, cause: str, phase: str) -> None:
        super().__init__(message)
        self.cause = cause
        self.phase = phase


def classify(message: str) -> str:
    text = message.lower()
    if "connection closed by peer" in text:
        return "closed"
    if "reset by peer" in text:
        return "reset"
    if "timed out" in text or "timeout" in text:
        return "timeout"
    if "broken pipe" in text:
        return "closed"
    return "other"


def _short(exc: BaseException) -> str:
    # gloo prefixes its messages with the C++ source location: keep the words.
    return re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", str(exc)).strip().splitlines()[0][:300]


class Group(Protocol):
    """What the runner needs of a process group (a fake implements it in unit tests)."""

    generation: int
    rank: int
    world_size: int

    def join(self, failed_generation: int | None) -> int: ...
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None: ...
    def leave(self) -> float: ...
    def health_check(self, timeout_s: float) -> tuple[bool, str]: ...


class GlooGroup:
    """The default process group over gloo, re-formed per generation under one store."""

    def __init__(self, store: dist.Store, store_address: tuple[str, int], rank: int,
                 world_size: int, timeout_s: float, rendezvous_timeout_s: float,
                 on_wait: Callable[[int, int], None] = lambda gen, arrived: None) -> None:
        self.store = store
        self.store_address = store_address
        self.rank = rank
        self.world_size = world_size
        self.timeout = timedelta(seconds=timeout_s)
        self.rendezvous_timeout_s = rendezvous_timeout_s
        self.on_wait = on_wait  # called while waiting in a rendezvous: (generation, arrived)
        self.generation = -1

    def join(self, failed_generation: int | None) -> int:
        """Join the current generation; after a failure in generation g, move past g.

        Rendezvous first: every rank counts itself in under ``gen<N>/arrived`` and waits,
        up to the rendezvous timeout, until all have arrived; only then is the gloo group
        formed (with the collective timeout). A rank whose rendezvous times out bumps the
        generation, so that late ranks never count into a generation the others left.
        """
        try:
            if failed_generation is None:
                gen = int(self.store.get(GENERATION_KEY))
            else:
                old, new = str(failed_generation), str(failed_generation + 1)
                gen = int(self.store.compare_set(GENERATION_KEY, old, new))
            self.generation = gen
            if not self._rendezvous(gen):
                self.store.compare_set(GENERATION_KEY, str(gen), str(gen + 1))
                raise CollectiveError(
                    f"rendezvous of generation {gen} timed out after "
                    f"{self.rendezvous_timeout_s:g}s waiting for {self.world_size} ranks",
                    "rendezvous", "join")
            dist.init_process_group("gloo", store=dist.PrefixStore(f"gen{gen}/", self.store),
                                    rank=self.rank, world_size=self.world_size, timeout=self.timeout)
        except (RuntimeError, ValueError) as exc:  # DistError derives from RuntimeError
            raise CollectiveError(_short(exc), "rendezvous", "join") from exc
        return self.generation

    def _rendezvous(self, gen: int) -> bool:
        complete, arrived_key = f"gen{gen}/complete", f"gen{gen}/arrived"
        arrived = self.store.add(arrived_key, 1)
        if arrived == self.world_size:
            self.store.set(complete, "1")
        deadline = time.monotonic() + self.rendezvous_timeout_s
        next_report = 0.0
        while (left := deadline - time.monotonic()) > 0:
            if time.monotonic() >= next_report:  # a rank waiting here is acting, not hung
                self.on_wait(gen, arrived)
                next_report = time.monotonic() + RENDEZVOUS_REPORT_S
            try:  # waits in slices so that a SIGTERM is handled within one
                self.store.wait([complete], timedelta(seconds=min(left, RENDEZVOUS_SLICE_S)))
                return True
            except RuntimeError:
                arrived = self.store.add(arrived_key, 0)
        return False

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        try:
            work = dist.all_reduce(tensor, op=_OPS[op], async_op=True)
            while not work.is_completed():
                time.sleep(POLL_INTERVAL_S)
            work.wait()
        except RuntimeError as exc:
            raise CollectiveError(_short(exc), classify(str(exc)), "step") from exc

    def leave(self) -> float:
        """Destroy the group so its sockets close and peers see it; returns seconds taken."""
        start = time.monotonic()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except RuntimeError:
                pass  # a group that failed may refuse a clean destroy; it is gone either way
        gc.collect()  # tracebacks hold the failed work, and the work holds the group's sockets
        return time.monotonic() - start

    def health_check(self, timeout_s: float) -> tuple[bool, str]:
        """Can this host reach the control plane? A TCP connect within `timeout_s`."""
        try:
            with socket.create_connection(self.store_address, timeout=timeout_s):
                return True, "control plane reachable"
        except OSError as exc:
            return False, f"control plane unreachable: {exc.strerror or exc}"
