"""The fault-tolerant runner: the document's `DistributedFaultTolerantRunner`, done right.

    run step ── ok ──> advance, checkpoint every K steps
        └─ collective failed ─> release the group (outside the except block, so no
           traceback keeps its sockets open) ─> retries left?
              no  ─> breaker? open it : fail fast ─> free accelerator memory, exit
              yes ─> backoff base*2^n (capped) + jitter ─> health check
                        fail ─> breaker? open it : count the try, back off again
                        pass ─> join the next generation ─> restore the checkpoint
                                all ranks agree on (min over ranks) ─> run step

The runner depends only on the `Group` protocol, an event recorder, a sleep function and a
seeded RNG, so its retry/backoff/breaker logic is unit-tested with fakes and the same code
runs against real gloo groups in the job.
"""
from __future__ import annotations

import enum
import random
import time
from typing import Callable

import torch

from harness.checkpoint import Checkpointer
from harness.events import EventRecorder
from harness.group import CollectiveError, Group
from harness.policies import PolicySpec
from harness.workload import Workload


class Outcome(enum.Enum):
    STOPPED = "stopped"                       # reached max_steps
    FAILED_FAST = "failed-fast"               # gave up at the first failure (timeout policy)
    RETRIES_EXHAUSTED = "retries-exhausted"   # retry policy ran out of tries
    ISOLATED = "isolated"                     # the breaker opened


EXIT_CODES = {Outcome.STOPPED: 0, Outcome.FAILED_FAST: 3, Outcome.RETRIES_EXHAUSTED: 4,
              Outcome.ISOLATED: 5}


class FaultTolerantRunner:
    def __init__(self, policy: PolicySpec, group: Group, workload: Workload,
                 checkpoints: Checkpointer, recorder: EventRecorder, rng: random.Random,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.policy = policy
        self.group = group
        self.workload = workload
        self.checkpoints = checkpoints
        self.recorder = recorder
        self.rng = rng
        self.sleep = sleep

    # -- the loop ------------------------------------------------------------------------

    def run(self, max_steps: int | None = None) -> Outcome:
        failure = self._join(None)
        while True:
            if failure is not None:
                outcome = self._recover(failure)
                if outcome is not None:
                    return outcome
                failure = None
            if max_steps is not None and self.workload.step >= max_steps:
                return Outcome.STOPPED
            failure = self._step()

    def _step(self) -> tuple[int, str] | None:
        """One paced training step; returns (generation, error) if a collective failed."""
        started = time.monotonic()
        step, gen = self.workload.step, self.group.generation
        try:
            loss = self.workload.train_step(self.group.all_reduce, self.group.world_size)
        except CollectiveError as exc:
            if not self.policy.catch_errors:
                self._record_error(exc, step, gen)
                raise
            self._record_error(exc, step, gen)
            return gen, str(exc)
        self.recorder.emit("step", step=step, gen=gen, loss=round(loss, 5),
                           dur=round(time.monotonic() - started, 4))
        if self.group.rank == 0 and self.workload.step % self.workload.spec.checkpoint_every == 0:
            self.checkpoints.save(self.workload.step, self.workload.state())
            self.recorder.emit("checkpoint", step=self.workload.step)
        spare = self.workload.spec.step_period - (time.monotonic() - started)
        if spare > 0:
            self.sleep(spare)
        return None

    def _record_error(self, exc: CollectiveError, step: int, gen: int) -> None:
        self.recorder.emit("collective_error", step=step, gen=gen, phase=exc.phase,
                           cause=exc.cause, error=str(exc))

    # -- recovery --------------------------------------------------------------------------

    def _recover(self, failure: tuple[int, str]) -> Outcome | None:
        """Called outside any except block. Returns an outcome to exit with, or None to go on."""
        failed_gen, error = failure
        self._release()
        attempt = 0
        while True:
            attempt += 1
            if attempt > self.policy.max_retries:
                if self.policy.breaker:
                    return self._shutdown(Outcome.ISOLATED, f"retries exhausted after: {error}")
                outcome = Outcome.FAILED_FAST if self.policy.max_retries == 0 else Outcome.RETRIES_EXHAUSTED
                return self._shutdown(outcome, error)
            delay = self.policy.backoff(attempt) + self.rng.uniform(*self.policy.jitter)
            self.recorder.emit("backoff", attempt=attempt, seconds=round(delay, 3))
            self.sleep(delay)
            ok, detail = self.group.health_check(self.policy.health_check_timeout)
            self.recorder.emit("health_check", attempt=attempt, ok=ok, detail=detail)
            if not ok:
                if self.policy.breaker:
                    return self._shutdown(Outcome.ISOLATED, f"health check failed: {detail}")
                error = detail
                continue
            self.recorder.emit("retry", attempt=attempt, after_gen=failed_gen)
            rejoin = self._join(failed_gen)
            if rejoin is None:
                return None
            failed_gen, error = rejoin
            self._release()

    def _join(self, failed_gen: int | None) -> tuple[int, str] | None:
        """Join a generation and restore the agreed checkpoint; returns the failure if any."""
        started = time.monotonic()
        try:
            gen = self.group.join(failed_gen)
            self.recorder.emit("group_ready", gen=gen, world=self.group.world_size,
                               secs=round(time.monotonic() - started, 3))
            self._restore()
        except CollectiveError as exc:
            self._record_error(exc, self.workload.step, self.group.generation)
            return self.group.generation, str(exc)
        return None

    def _restore(self) -> None:
        """All ranks load the same state: the newest checkpoint every rank can see (MIN)."""
        latest = self.checkpoints.latest()
        agreed = torch.tensor([-1 if latest is None else latest], dtype=torch.int64)
        self.group.all_reduce(agreed, "min")  # also proves the new group works
        step = int(agreed.item())
        if step < 0:
            self.workload.reset()
        else:
            self.workload.load_state(self.checkpoints.load(step))
        self.recorder.emit("restored", step=self.workload.step, gen=self.group.generation)

    def _release(self) -> None:
        secs = self.group.leave()
        self.recorder.emit("group_released", secs=round(secs, 3))

    def _shutdown(self, outcome: Outcome, reason: str) -> Outcome:
        """Leave for good: breaker event if it opened, then free what the rank holds."""
        if outcome is Outcome.ISOLATED:
            self.recorder.emit("breaker_open", reason=reason)
        before = after = None
        if torch.cuda.is_available():
            before = torch.cuda.memory_reserved()
            torch.cuda.empty_cache()
            after = torch.cuda.memory_reserved()
        self.recorder.emit("resources_released", outcome=outcome.value, group=True,
                           cuda_reserved_before=before, cuda_reserved_after=after)
        return outcome
