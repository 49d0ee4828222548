"""The state checker: did the job come back correct? A recorded history of `state` events
(fingerprints of every rank's parameters and optimizer state, runfolder.events) judged
against named invariants, apart from whatever injected the faults (as Jepsen's checkers).

    replicas agree     at every step that several ranks of one generation recorded, they
                       recorded one fingerprint; and the ranks of a generation resumed at
                       one step (a rank that restored an older checkpoint, or kept its own
                       state, resumes elsewhere)
    restore is real    a state a generation resumed from (a restore; a user's job: its
                       state before its first step) equals a state some rank recorded
                       before the fault at that step (a user's job: at any step, which then
                       says the step it resumed at): not a fresh initialisation, not a torn
                       or foreign checkpoint, and the optimizer's state with the weights;
                       nor a save that failed (`checkpoint_failed`), nor the initial state
                       once a checkpoint was written (a resume that silently starts from
                       scratch, as when a full disk left the newest file torn); nor (a user's
                       job) a load of a file that holds what none of its saves left there:
                       the newest save lost, as a crash of the storage loses what was not
                       fsynced (lose_unsynced) or a kill mid-save tears it. Named with the
                       file, its size, the step of the save lost and the step the loaders
                       resumed at (the steps lost), or that none of them stepped after it;
                       nor (the built-in runner) a restore that found a checkpoint whose save
                       had finished, durable, torn and went on from an older one (the save
                       lost; a read the disk failed, EIO, is a fallback, not a loss)
    progress is honest a rank's steps only go forward between resumes; steps rolled back
                       (thrown away by a resume) and repeated (run again) are counted per rank

A rank's shard (FSDP's or DTensor's parameters, ZeroRedundancyOptimizer's optimizer state:
`sharded` in its state events) differs from the others' by design: only what every rank
holds is compared across ranks, and a shard is matched only against its own rank's history.

Verdict: `consistent` (no invariant violated), `diverged` (the first violation names the
step, the ranks grouped by fingerprint and the event before it), `not observed` (no
fingerprints: a run folder before format 5, or a job whose hook saw no optimizer).

A framework that counts the job's steps itself (torchft: `step_source` in the events) gives
its own step: a replica group healed from a peer takes up the peer's step, so its states are
compared with every other group's at that step, and the state it started from (after the
heal) with what the others recorded at that step. Any other user's job counts steps per
process (the hook's count since the process began) and
its generation is torchrun's restart count: replicas are compared at the same count of
the same generation (and of the same process of it: a wrapper that starts a rank's
process again keeps the count, so the second process is a later epoch), and a resumed
state's step is the step of the recorded state it equals. The built-in workload's steps
are the training steps themselves.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from reports.checkpoints import Identity, file_identity
from runfolder.events import (CHECKPOINT, CHECKPOINT_FAILED, CHECKPOINT_LOAD, CHECKPOINT_SAVE, RESTORE_FAILED,
                              RESTORED)
from runfolder.plan import STATE_VERDICTS

CONSISTENT, DIVERGED, NOT_OBSERVED = STATE_VERDICTS  # the names a scenario may expect
REPLICAS_AGREE, RESTORE_IS_REAL, PROGRESS_IS_HONEST = "replicas agree", "restore is real", "progress is honest"
# what a violation says of the job's checkpoint code, for the storage invariants (reports.storage)
SAVE_LOST, TORN_RESTORED, FROM_SCRATCH, STEPS_APART = "save lost", "torn restored", "from scratch", "steps apart"
RESUMED = ("restore", "start")  # `at` of a state a generation resumed from
# what may explain a divergence: the last of these before it is named
CONTEXT_KINDS = ("restored", "group_ready", "membership", "rejoin_admitted", "rank_start",
                 "fault_applied", "fault_reverted", "rank_exited")


@dataclass(frozen=True)
class State:
    """One `state` event."""

    t: float
    rank: int
    local_rank: int
    pid: int
    gen: int
    step: int          # as recorded (a user's job: the process's own count)
    at: str            # step | restore | start
    params: str | None
    optim: str | None
    # (gen, n): the n-th process of this replica in generation gen (a wrapper that starts a
    # rank's process again keeps torchrun's restart count: its steps count from 0 again)
    epoch: tuple[int, int] = (0, 0)
    sharded: str | None = None  # params | optim: that part is this rank's shard, no replica's
    absolute: bool = False      # `step` is a framework's count of the job's steps, not the process's
    # a framework's named parts of the state (model, optimizer, LR scheduler, data position):
    # (name, fingerprint), sorted; () where none were recorded
    parts: tuple[tuple[str, str], ...] = ()

    @property
    def replica(self) -> tuple[int, int]:
        return self.rank, self.local_rank

    @property
    def process(self) -> tuple[int, int]:
        """(rank, pid): a pid alone is not one process across hosts (every container's first
        process is pid 1)."""
        return self.rank, self.pid

    @property
    def values(self) -> tuple[str | None, str | None]:
        return self.params, self.optim

    @property
    def replicated(self) -> tuple[str | None, str | None] | None:
        """What every rank holds alike, to compare across ranks; None when nothing is."""
        if self.sharded == "params":
            return None
        return (self.params, None) if self.sharded == "optim" else (*self.values, self.parts)


@dataclass(frozen=True)
class Violation:
    invariant: str
    t: float
    gen: int
    step: int
    ranks: tuple[str, ...]  # the ranks it names (minority first)
    detail: str
    checkpoint: str = ""    # SAVE_LOST, TORN_RESTORED, FROM_SCRATCH, STEPS_APART: a checkpoint's part in it


@dataclass(frozen=True)
class StateVerdict:
    verdict: str
    violations: tuple[Violation, ...] = ()
    states: int = 0                                   # state events judged
    ranks: int = 0                                    # replicas that recorded one
    compared: int = 0                                 # (gen, step) points several ranks recorded
    restores_checked: int = 0                         # resumed states matched against the history
    restores_unchecked: int = 0                       # resumed at a step nobody recorded before
    rolled_back: dict[str, int] = field(default_factory=dict)  # replica -> steps thrown away
    repeated: dict[str, int] = field(default_factory=dict)     # replica -> steps run again
    context: str = ""                                 # the event before the first violation
    # checkpoints a restore skipped: (restored step, skipped step, how: unreadable | torn,
    # error), from the built-in runner's `restored` events (harness.job.restore)
    skipped: tuple[tuple[int, int, str, str], ...] = ()

    def _resumes(self) -> str:
        """'; restored step 10 past the unreadable checkpoint of step 15 (...); steps lost: 7
        on ranks 0,1,2,3': what the resumes cost, where they cost anything."""
        parts = [f"restored step {step} past the {how} checkpoint of step {skipped} ({error})"
                 for step, skipped, how, error in self.skipped]
        by_count: dict[int, list[str]] = {}
        for replica, steps in self.rolled_back.items():
            by_count.setdefault(steps, []).append(replica)
        parts += [f"steps lost: {steps} on {'rank' if len(r) == 1 else 'ranks'} "
                  f"{','.join(sorted(r, key=lambda label: tuple(map(int, label.split('.')))))}"
                  for steps, r in sorted(by_count.items(), reverse=True)]
        return "".join(f"; {part}" for part in parts)

    @property
    def first(self) -> Violation | None:
        return self.violations[0] if self.violations else None

    def summary(self, t0: float = 0.0) -> str:
        """One line: the verdict and what it rests on, or the first violation."""
        if self.verdict == NOT_OBSERVED:
            return "state not observed (no fingerprints recorded)"
        if self.verdict == CONSISTENT:
            restores = f", {self.restores_checked} resumed states real" if self.restores_checked else ""
            return (f"state consistent ({self.states} fingerprints of {self.ranks} ranks, "
                    f"{self.compared} steps compared{restores}){self._resumes()}")
        first = self.first
        assert first is not None
        more = f"; {len(self.violations) - 1} more" if len(self.violations) > 1 else ""
        context = f"; before it: {self.context}" if self.context else ""
        return f"state diverged: {first.invariant}: {first.detail} at {first.t - t0:+.2f} s{context}{more}"


def replica_label(replica: tuple[int, int], local_ranks: bool) -> str:
    rank, local = replica
    return f"{rank}.{local}" if local_ranks else str(rank)


def _int(value: Any, default: int = 0) -> int:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return default
    return int(value)


def _text(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def states_of(events: Iterable[Mapping[str, Any]]) -> list[State]:
    found = sorted((State(float(e["t"]), _int(e.get("rank")), _int(e.get("local_rank")), _int(e.get("pid")),
                          _int(e.get("gen")), _int(e.get("step")), str(e.get("at")), _text(e.get("fingerprint")),
                          _text(e.get("optim")), sharded=_text(e.get("sharded")),
                          absolute=bool(e.get("step_source")),
                          parts=tuple(sorted((str(k), str(v)) for k, v in (e.get("parts") or {}).items())))
                    for e in events if e.get("kind") == "state"), key=lambda s: s.t)
    processes: dict[tuple[int, int, int], list[int]] = {}  # (rank, local_rank, gen) -> pids in order
    for s in found:
        pids = processes.setdefault((*s.replica, s.gen), [])
        if s.pid not in pids:
            pids.append(s.pid)
    return [replace(s, epoch=(s.gen, processes[(*s.replica, s.gen)].index(s.pid))) for s in found]


def _process(event: Mapping[str, Any]) -> tuple[int, int]:
    """An event's process as State.process names it."""
    return _int(event.get("rank")), _int(event.get("pid"))


def _short(value: str | None) -> str:
    return "none" if value is None else value[:8]


def _by_value(members: Mapping[tuple[int, int], State]) -> list[tuple[tuple[str | None, str | None], list[tuple[int, int]]]]:
    """The members grouped by what they hold alike, largest group first (then lowest rank)."""
    groups: dict[tuple[str | None, str | None], list[tuple[int, int]]] = {}
    for replica, state in sorted(members.items()):
        groups.setdefault(state.replicated or state.values, []).append(replica)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))


def _grouped(members: Mapping[tuple[int, int], State], labels: Mapping[tuple[int, int], str]) -> str:
    """'ranks 0,1,2 a1b2c3d4; rank 3 9f8e7d6c': fingerprint groups, largest first; where a
    framework named the parts of its state, those that differ ('the lr_scheduler differs')."""
    parts = []
    for values, replicas in _by_value(members):
        word = "rank" if len(replicas) == 1 else "ranks"
        optim = "" if values[1] is None else f"/{_short(values[1])}"
        parts.append(f"{word} {','.join(labels[r] for r in replicas)} {_short(values[0])}{optim}")
    apart = _parts_apart(list(members.values()))
    return "; ".join(parts) + (f" ({_parts_text(apart)} differs)" if apart else "")


def _parts_apart(states: list[State]) -> list[str]:
    """The named parts (a framework's) whose fingerprints differ among these states."""
    seen: dict[str, set[str]] = {}
    for state in states:
        for name, value in state.parts:
            seen.setdefault(name, set()).add(value)
    return sorted(name for name, values in seen.items() if len(values) > 1)


def _parts_text(names: list[str]) -> str:
    return "the " + ", the ".join(names)


def _minority(members: Mapping[tuple[int, int], State], labels: Mapping[tuple[int, int], str]) -> tuple[str, ...]:
    """The ranks outside the largest group: those the divergence names."""
    return tuple(labels[r] for _, replicas in _by_value(members)[1:] for r in replicas)


def _where(state: State, user_job: bool) -> str:
    if state.absolute:
        return f"{'the start at ' if state.at == 'start' else ''}step {state.step} (the framework's count)"
    if state.at == "start":
        return f"the start of generation {state.gen}"
    if user_job:
        return f"step {state.step} of generation {state.gen} (the process's own count)"
    return f"step {state.step} (generation {state.gen})"


def check_state(events: Iterable[Mapping[str, Any]]) -> StateVerdict:
    """Judge a trial's recorded history (its events, in any order) by the invariants."""
    events = list(events)
    states = states_of(events)
    if not states:
        return StateVerdict(NOT_OBSERVED)
    local_ranks = any(s.local_rank for s in states)
    user_job = any(s.at == "start" for s in states)
    labels = {s.replica: replica_label(s.replica, local_ranks) for s in states}
    violations: list[Violation] = []
    # a resume from a peer's memory read no checkpoint: what happened to the saves is not its
    # to answer for (its state is still judged against what was recorded at its step)
    from_peers = {(_int(e.get("rank")), _int(e.get("pid")), _int(e.get("gen"))) for e in events
                  if e.get("kind") == RESTORED and e.get("source") == "peer"}

    # replicas agree: one fingerprint per (generation, step), the latest of each replica
    points: dict[tuple[tuple[int, int], int], dict[tuple[int, int], State]] = {}
    for s in states:
        if s.replicated is not None:  # a framework's step is the job's, whichever process made it
            points.setdefault(((0, 0) if s.absolute else s.epoch, s.step), {})[s.replica] = s
    compared = 0
    for ((gen, _), step), members in points.items():
        if len(members) < 2:
            continue
        compared += 1
        if len({s.replicated for s in members.values()}) > 1:
            latest = max(members.values(), key=lambda s: s.t)
            violations.append(Violation(REPLICAS_AGREE, latest.t, gen, step, _minority(members, labels),
                                        f"{_where(latest, user_job)}: {_grouped(members, labels)}"))
    resumes: dict[tuple[int, int], dict[tuple[int, int], State]] = {}
    for s in states:
        if s.at in RESUMED and not s.absolute:  # a framework's group joins at its peers' step
            resumes.setdefault(s.epoch, {}).setdefault(s.replica, s)  # the first resume of each in a generation
    for (gen, _), members in resumes.items():
        steps: dict[int, list[tuple[int, int]]] = {}
        for replica, s in members.items():
            steps.setdefault(s.step, []).append(replica)
        if len(steps) > 1:
            latest = max(members.values(), key=lambda s: s.t)
            ordered = sorted(steps.items(), key=lambda kv: len(kv[1]))
            text = "; ".join(f"{'rank' if len(r) == 1 else 'ranks'} {','.join(labels[x] for x in sorted(r))} "
                             f"at step {step}" for step, r in reversed(ordered))
            violations.append(Violation(REPLICAS_AGREE, latest.t, gen, ordered[-1][0],
                                        tuple(labels[r] for _, rs in ordered[:-1] for r in sorted(rs)),
                                        f"generation {gen} resumed at different steps: {text}", STEPS_APART))

    # restore is real, and the absolute step of every state (a user's job: offset per process)
    saves = sorted((float(e["t"]), e["kind"], _int(e.get("step"))) for e in events
                   if e.get("kind") in (CHECKPOINT, CHECKPOINT_SAVE, CHECKPOINT_FAILED))
    offsets: dict[tuple[int, int], int | None] = {}
    absolute: list[tuple[State, int | None]] = []
    recorded = Recorded()
    checked = unchecked = 0
    for s in states:
        if s.absolute:
            step = s.step
            if s.at == "start":  # what it took up (a peer's state where it healed) equals what the others recorded
                before = [e for e in recorded.by_others(s, step) if _comparable(e, s)]
                if before:
                    checked += 1
                    if s.values not in {e.values for e in before}:
                        same = [(e, step) for e in before if e.params == s.params]
                        violations.append(_not_real(s, same, labels, user_job, recorded=before))
                    elif apart := _parts_apart([s, *(e for e in before if e.values == s.values)]):
                        violations.append(Violation(
                            RESTORE_IS_REAL, s.t, s.gen, s.step, (labels[s.replica],),
                            f"rank {labels[s.replica]} resumed at {_where(s, user_job)} with the weights and "
                            f"optimizer state recorded there but not the others' {', '.join(apart)}: the state "
                            "it took up did not carry it whole"))
                elif step > 0:
                    unchecked += 1
        elif s.at == "start":
            if not recorded.before(s.epoch):
                offsets[s.process] = 0
            else:
                candidates = [(e, a) for e, a in recorded.with_params(s.epoch, s.params) if _comparable(e, s)]
                exact = [a for e, a in candidates if e.optim == s.optim]
                checked += 1
                if exact:
                    offsets[s.process] = max(exact)
                else:
                    offsets[s.process] = max(a for _, a in candidates) if candidates else None
                    violations.append(_not_real(s, candidates, labels, user_job))
            step = offsets[s.process]
        else:
            offset = offsets.get(s.process, 0)
            step = None if offset is None else offset + s.step
            if s.at == "restore" and step is not None:
                before = [e for e in recorded.at_step(s.epoch, step) if _comparable(e, s)]
                if not before:
                    unchecked += s.epoch > (0, 0)
                else:
                    checked += 1
                    if s.values not in {e.values for e in before}:
                        same = [(e, step) for e in before if e.params == s.params]
                        violations.append(_not_real(s, same, labels, user_job, recorded=before))
        if (s.at in RESUMED and s.epoch > (0, 0) and step is not None and not s.absolute  # a framework heals from peers
                and (s.rank, s.pid, s.gen) not in from_peers):
            problem = _lost_checkpoint(s, step, saves, labels, user_job)
            if problem is not None:
                violations.append(problem)
        absolute.append((s, step))
        recorded.add(s, step)

    violations += _lost_saves(events, states, offsets, labels)
    passed_over = _skipped(events)
    violations += _torn_saves(passed_over, saves, labels)
    skipped = tuple(dict.fromkeys((_int(e.get("step")), step, how, error) for e, step, how, error in passed_over
                                  if e.get("kind") == RESTORED))

    # progress is honest: forward between resumes; rolled back and repeated per replica
    rolled_back: dict[str, int] = {}
    repeated: dict[str, int] = {}
    reached: dict[tuple[int, int], int] = {}
    last_step: dict[tuple[int, int, int], int] = {}
    for s, step in absolute:
        if step is None:
            continue
        label = labels[s.replica]
        top = reached.get(s.replica)
        if s.at in RESUMED:
            if top is not None and step < top:
                rolled_back[label] = rolled_back.get(label, 0) + top - step
            last_step.pop((s.process, s.gen, s.local_rank), None)
            continue
        previous = last_step.get((s.process, s.gen, s.local_rank))
        if previous is not None and step <= previous:
            violations.append(Violation(PROGRESS_IS_HONEST, s.t, s.gen, s.step, (label,),
                                        f"rank {label} recorded step {step} after step {previous} "
                                        f"in generation {s.gen} with no resume between"))
        if top is not None and step <= top:
            repeated[label] = repeated.get(label, 0) + 1
        last_step[(s.process, s.gen, s.local_rank)] = step
        reached[s.replica] = max(step, top if top is not None else step)

    # at one instant, the cause before its symptom: a rank that did not restore (restore is
    # real) before the replicas that then disagree with it
    violations.sort(key=lambda v: (v.t, (RESTORE_IS_REAL, PROGRESS_IS_HONEST, REPLICAS_AGREE).index(v.invariant)))
    verdict = DIVERGED if violations else CONSISTENT
    return StateVerdict(verdict, tuple(violations), len(states), len(labels), compared, checked, unchecked,
                        rolled_back, repeated, _context(events, violations[0]) if violations else "",
                        skipped)


SKIPPED = ("unreadable", "torn")  # the fields naming the checkpoints a restore passed over


def _skipped(events: list[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], int, str, str]]:
    """Each checkpoint a restore passed over, in time order: (its `restored` event, or its
    `restore_failed` where it could read none, the step skipped, unreadable | torn, the error)."""
    return [(e, int(step), how, str(error))
            for e in sorted((e for e in events if e.get("kind") in (RESTORED, RESTORE_FAILED)),
                            key=lambda e: float(e["t"]))
            for how in SKIPPED if isinstance(e.get(how), dict) for step, error in e[how].items()]


def _torn_saves(skipped: list[tuple[Mapping[str, Any], int, str, str]], saves: list[tuple[float, str, int]],
                labels: Mapping[tuple[int, int], str]) -> list[Violation]:
    """A checkpoint the runner saved durably (its `checkpoint` event) that a restore found
    torn: the save was lost (a crash of storage that ignored the fsync, or a save that
    claimed durability it did not have). A read the disk failed (unreadable) is no such
    loss: the storage fails now, the bytes may be whole."""
    found = []
    for restored, step, how, error in skipped:
        done = [t for t, kind, saved in saves if kind == CHECKPOINT and saved == step and t < float(restored["t"])]
        if how != "torn" or not done:
            continue
        label = labels.get((_int(restored.get("rank")), 0), str(_int(restored.get("rank"))))
        resumed = _int(restored.get("step"), -1)
        found.append(Violation(
            RESTORE_IS_REAL, float(restored["t"]), _int(restored.get("gen")), max(resumed, 0), (label,),
            f"rank {label} found the checkpoint of step {step} torn ({error}), though its save finished "
            f"{float(restored['t']) - done[-1]:.2f} s before: that save was lost; "
            + (f"the job resumed at step {resumed} ({step - resumed} steps lost)" if restored.get("kind") == RESTORED
               else "no checkpoint could be read: the restore failed"), SAVE_LOST))
    return found


def _lost_checkpoint(s: State, step: int, saves: list[tuple[float, str, int]],
                     labels: Mapping[tuple[int, int], str], user_job: bool) -> Violation | None:
    """A resume from a save that failed, or from scratch once a checkpoint was written."""
    before = [(t, kind, saved) for t, kind, saved in saves if t <= s.t]
    label = labels[s.replica]
    if step == 0 and any(kind != CHECKPOINT_FAILED for _, kind, _ in before):
        t, _, saved = next(x for x in reversed(before) if x[1] != CHECKPOINT_FAILED)
        which = "a checkpoint" if user_job else f"the checkpoint of step {saved}"
        return Violation(RESTORE_IS_REAL, s.t, s.gen, s.step, (label,),
                         f"rank {label} resumed at {_where(s, user_job)} from scratch (the initial state) "
                         f"though {which} was written {s.t - t:.2f} s before: the restore did not find it",
                         FROM_SCRATCH)
    outcome = [kind for _, kind, saved in before if saved == step and kind != CHECKPOINT_SAVE]
    if not user_job and outcome and outcome[-1] == CHECKPOINT_FAILED:
        return Violation(RESTORE_IS_REAL, s.t, s.gen, s.step, (label,),
                         f"rank {label} resumed at {_where(s, user_job)}, whose save failed: a torn checkpoint",
                         TORN_RESTORED)
    return None


def _lost_saves(events: list[Mapping[str, Any]], states: list[State], offsets: Mapping[tuple[int, int], int | None],
                labels: Mapping[tuple[int, int], str]) -> list[Violation]:
    """Loads of a file one of the job's saves left (the same inode in the same folder: a
    rename keeps it) that read what none of them left there (its modification time or size
    changed since); one violation per file as read, unless every loader resumed at the step
    of the newest save (the same bytes written again)."""
    saves = sorted(((float(e["t"]), os.path.dirname(str(e["path"])), ident, e) for e in events
                    if e.get("kind") == CHECKPOINT_SAVE and (ident := file_identity(e.get("file"))) is not None),
                   key=lambda save: save[0])
    lost: dict[tuple[str, Identity], tuple[tuple[float, Identity, Mapping[str, Any]], list[Mapping[str, Any]]]] = {}
    for load in sorted((e for e in events if e.get("kind") == CHECKPOINT_LOAD), key=lambda e: float(e["t"])):
        read, folder = file_identity(load.get("file")), os.path.dirname(str(load.get("path")))
        if read is None:
            continue
        left = [(t, ident, e) for t, where, ident, e in saves
                if t < float(load["t"]) and where == folder and ident[0] == read[0]]
        if left and read not in {ident for _, ident, _ in left}:
            lost.setdefault((str(load["path"]), read), (left[-1], []))[1].append(load)
    found = []
    for (path, read), ((saved_t, saved_file, save), loads) in lost.items():
        saved = (offsets.get(_process(save)) or 0) + _int(save.get("step"))
        resumed = sorted({step for load in loads for s in states
                          if s.process == _process(load) and s.at == "start" and s.t >= float(load["t"])
                          and (step := offsets.get(s.process)) is not None})
        if resumed and resumed[0] >= saved:
            continue
        loaders = sorted({labels.get((_int(e.get("rank")), _int(e.get("local_rank"))), str(_int(e.get("rank"))))
                          for e in loads})
        first = loads[0]
        size = "empty (0 bytes)" if read[2] == 0 else f"{read[2]} bytes"
        detail = (f"{'rank' if len(loaders) == 1 else 'ranks'} {','.join(loaders)} loaded {_short_path(path)}, "
                  f"{size}, not what rank {_int(save.get('rank'))}'s save of step {saved} left there "
                  f"({saved_file[2]} bytes, {float(first['t']) - saved_t:.2f} s before): that save was lost; "
                  + (f"the job resumed at step {resumed[0]} ({saved - resumed[0]} steps lost)" if resumed else
                     f"no process that loaded it stepped after ({len(loads)} loads): it could not be loaded"))
        gen = max((s.gen for s in states if s.process == _process(first)), default=0)
        found.append(Violation(RESTORE_IS_REAL, float(first["t"]), gen, saved, tuple(loaders), detail, SAVE_LOST))
    return found


def _short_path(path: str) -> str:
    """A checkpoint's file with its folder: the part of the path a reader recognises."""
    return os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))


def _comparable(earlier: State, resumed: State) -> bool:
    """Whether a resumed state may equal an earlier one: a shard only its own replica's."""
    return not (resumed.sharded or earlier.sharded) or earlier.replica == resumed.replica


class Recorded:
    """The states recorded so far, by epoch (generation, process): found by step and by
    parameters."""

    def __init__(self) -> None:
        self._by_step: dict[tuple[int, int], dict[int, list[State]]] = {}
        self._by_params: dict[tuple[int, int], dict[str | None, list[tuple[State, int]]]] = {}

    def add(self, state: State, step: int | None) -> None:
        if step is not None:
            self._by_step.setdefault(state.epoch, {}).setdefault(step, []).append(state)
            self._by_params.setdefault(state.epoch, {}).setdefault(state.params, []).append((state, step))

    def before(self, epoch: tuple[int, int]) -> bool:
        return any(e < epoch for e in self._by_step)

    def at_step(self, epoch: tuple[int, int], step: int) -> list[State]:
        """States of earlier epochs at this step (before the fault this one follows)."""
        return [s for e, steps in self._by_step.items() if e < epoch for s in steps.get(step, ())]

    def by_others(self, state: State, step: int) -> list[State]:
        """The states other replicas recorded at this step, in any epoch."""
        return [s for steps in self._by_step.values() for s in steps.get(step, ()) if s.replica != state.replica]

    def with_params(self, epoch: tuple[int, int], params: str | None) -> list[tuple[State, int]]:
        return [found for e, by in self._by_params.items() if e < epoch for found in by.get(params, ())]


def _not_real(s: State, same_params: list[tuple[State, int | None]], labels: Mapping[tuple[int, int], str],
              user_job: bool, recorded: list[State] | None = None) -> Violation:
    label = labels[s.replica]
    if same_params:
        step = max(a for _, a in same_params if a is not None) if any(a is not None for _, a in same_params) else s.step
        detail = (f"rank {label} resumed at {_where(s, user_job)} with the weights of step {step} but another "
                  f"optimizer state ({_short(s.optim)}, recorded {_short(same_params[0][0].optim)}): "
                  "the optimizer's state was not restored")
    elif recorded:
        seen = sorted({_short(e.params) for e in recorded})
        detail = (f"rank {label} resumed at {_where(s, user_job)} from weights {_short(s.params)} that no rank "
                  f"recorded at that step (recorded: {', '.join(seen)}): a torn or foreign checkpoint")
    else:
        detail = (f"rank {label} resumed at {_where(s, user_job)} from weights {_short(s.params)} that no rank "
                  "recorded before: neither a checkpoint of this run nor its initial weights")
    return Violation(RESTORE_IS_REAL, s.t, s.gen, s.step, (label,), detail, "" if same_params else TORN_RESTORED)


def _context(events: list[Mapping[str, Any]], violation: Violation) -> str:
    """The last event that may explain a violation: of a rank it names, or of the harness."""
    named = set(violation.ranks)
    before = [e for e in events if e.get("kind") in CONTEXT_KINDS and float(e["t"]) <= violation.t
              and (e.get("src") == "harness" or str(_int(e.get("rank"), -1)) in {n.split(".")[0] for n in named})]
    if not before:
        return ""
    last = max(before, key=lambda e: float(e["t"]))
    who = "the harness" if last.get("src") == "harness" else f"rank {_int(last.get('rank'))}"
    fields = {k: last[k] for k in ("step", "gen", "source", "peer", "fault_kind", "targets", "signal")
              if k in last and last[k] is not None and not (isinstance(last[k], float) and math.isnan(last[k]))}
    text = ", ".join(f"{k} {v}" for k, v in fields.items())
    return f"{who}: {last['kind']}" + (f" ({text})" if text else "")
