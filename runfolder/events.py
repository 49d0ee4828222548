"""Events: flat JSON lines, one `os.write` per event, into a trial's ``events.jsonl``.

Every process of a trial (the harness and each rank) appends to the same file with
O_APPEND, so lines never interleave and a rank that dies leaves everything it wrote. Times
are ``time.monotonic()``: one clock domain for all processes that share a kernel (the trial
info records the wall-clock anchor). A process on another machine (a Slurm node) writes
its times on the harness's clock: its node agent measured the node's offset and set
CHAOS_CLOCK_OFFSET (node clock - harness clock, seconds), which every recorder subtracts.

Every event has `t` (monotonic seconds), `src` ("rank" | "harness"), `rank` (int, or null
for the harness; the rank an event is about for `rank_spawned` and `rank_exited`), `pid`,
`kind`, and the fields of its kind: `SCHEMA` below, one constant per kind.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

EVENTS_FILE = "events.jsonl"  # in each trial's folder (runfolder.layout)
RANK = "rank"
HARNESS = "harness"
COMMON_FIELDS = ("t", "src", "rank", "pid", "kind")


@dataclass(frozen=True)
class EventKind:
    """One kind of event: who writes it, the fields it always has, those it may have."""

    name: str
    src: str                          # RANK | HARNESS
    fields: tuple[str, ...]
    meaning: str
    optional: tuple[str, ...] = ()


SCHEMA: dict[str, EventKind] = {}  # kind name -> its definition, filled by the constants below


def _kind(name: str, src: str, fields: tuple[str, ...], meaning: str, optional: tuple[str, ...] = ()) -> str:
    """Define a kind in SCHEMA; its constant is the plain name, as events carry it."""
    if name in SCHEMA:
        raise ValueError(f"event kind {name!r} defined twice")
    SCHEMA[name] = EventKind(name, src, fields, meaning, optional)
    return name


# -- written by a rank --------------------------------------------------------------------
RANK_START = _kind("rank_start", RANK, ("policy", "world"),
                   "the rank process began (local_rank: which of its host's processes, from a "
                   "user's job; restart: torchrun's restart count of its worker group, "
                   "TORCHELASTIC_RESTART_COUNT, from a user's job; flight: true when it dumps its "
                   "flight recorder on SIGUSR2, harness.job.flight)", optional=("local_rank", "restart", "flight"))
FLIGHT_READY = _kind("flight_ready", RANK, (),
                     "a user's job's process (the startup hook, at its first optimizer step) dumps "
                     "its flight recorder on SIGUSR2 from now on, also while it waits inside a "
                     "collective (harness.job.flight.serve)")
RENDEZVOUS = _kind("rendezvous", RANK, ("gen", "arrived", "world"),
                   "still waiting for the others to join generation gen (every 5 s)")
GROUP_READY = _kind("group_ready", RANK, ("gen", "world", "group_rank", "secs"),
                    "a process group is formed, after secs")
MEMBERSHIP = _kind("membership", RANK, ("gen", "world", "members", "left_out", "joined"),
                   "the agreed members changed (original rank ids, in group-rank order)")
RESTORED = _kind("restored", RANK, ("step", "gen", "source"),
                 "state loaded: source checkpoint (the newest of the lowest group rank that has "
                 "one that it can read; `peer` and `bytes` when that rank sent it to members whose "
                 "disk lacks it or cannot read it; on that rank, the newer checkpoints it skipped, "
                 "step -> error: `unreadable`, the disk failed the read, `torn`, no checkpoint) | peer "
                 "(in-memory state sent by original rank `peer`, `bytes` long) | initial (a new "
                 "process that starts again from the seeded weights: bench/torchrun_kill.py)",
                 optional=("peer", "bytes", "unreadable", "torn"))
RESTORE_FAILED = _kind("restore_failed", RANK, ("gen",),
                       "a restore found checkpoints and could read none of them; the rank ends "
                       "crashed (harness.job.restore.NoReadableCheckpoint). On the rank that "
                       "held them, each one tried, step -> error: `unreadable` (the disk failed "
                       "the read) or `torn` (what it read is no checkpoint)",
                       optional=("unreadable", "torn"))
STEP = _kind("step", RANK, ("step", "gen", "loss", "dur"),
             "a training step completed (a user's job: loss null, dur null for its first; "
             "local_rank: which of its host's processes, from the hook; cpu_s with a process's "
             "first step: the CPU seconds it had used since it started, its imports included; "
             "compute: the seconds of the step before its all-reduce (a user's job: the step "
             "less the wait from its last gradient to its optimizer step), which a straggler "
             "score compares across ranks; a framework that counts the job's steps, "
             "step_source: torchft: `step` is its step, which a group healed from a peer takes up, "
             "and participants the replica groups of the step's quorum)",
             optional=("local_rank", "cpu_s", "compute", "participants", "step_source"))
STATE = _kind("state", RANK, ("step", "gen", "at", "fingerprint", "optim"),
              "a fingerprint of the rank's training state (harness.job.fingerprint): fingerprint "
              "of the model's parameters, optim of the optimizer's state (null: none); at: step "
              "(after step `step`) | restore (the state the generation resumed from, at step "
              "`step`) | start (a user's job: the state before this process's first optimizer "
              "step; `step` counts that process's optimizer steps, so 0, and gen is torchrun's "
              "restart count); local_rank: which of its host's processes, from the hook; sharded: "
              "params (FSDP, DTensor: parameters and optimizer state are this rank's shard) | optim "
              "(ZeroRedundancyOptimizer: the optimizer's state is), not compared across ranks; "
              "step_source: torchft: `step` is the framework's step (a start: the step whose "
              "state the process took up, a peer's where it healed); parts: name -> fingerprint "
              "of each part of the state the framework heals peers with (model, optimizer, LR "
              "scheduler, data position: the script's state_dict)",
              optional=("local_rank", "sharded", "step_source", "parts"))
CHECKPOINT_BEGIN = _kind("checkpoint_begin", RANK, ("step",),
                         "a checkpoint save began: the runner's (group rank 0; `checkpoint` or "
                         "`checkpoint_failed` ends it), or a user's job's torch.save / dcp save (from the "
                         "hook: path, api and local_rank as checkpoint_save, which ends it)",
                         optional=("path", "local_rank", "api"))
CHECKPOINT = _kind("checkpoint", RANK, ("step",), "a checkpoint written atomically (group rank 0)")
CHECKPOINT_FAILED = _kind("checkpoint_failed", RANK, ("step", "errno", "error"),
                          "the disk refused the checkpoint of `step` (errno: ENOSPC, EROFS, ...); the "
                          "older ones stay the newest durable (group rank 0)")
SUSPECT = _kind("suspect", RANK, ("peer", "via", "cause", "silent_s", "gen", "waited_s"),
                "the failure detector suspects `peer`; via = cause: connection (its process is "
                "gone) | heartbeat (silent for silent_s) | cut-off (this rank hears no digest: "
                "peer is itself) | generation (the peer moved on); once per (gen, peer, via); "
                "agent: a torchrun agent stops its worker group (bench/torchrun_kill.py; peer, "
                "silent_s and waited_s null)")
STRAGGLER = _kind("straggler", RANK, ("peer", "loss", "silent_s", "waited_s", "gen", "step"),
                  "a collective pending waited_s with every member alive; peer: one whose "
                  "heartbeats arrive degraded (null when none does)")
COLLECTIVE_ERROR = _kind("collective_error", RANK, ("step", "gen", "phase", "cause", "error"),
                         "phase: step | join; cause: timeout | closed | reset | rendezvous | "
                         "suspect (the detector ended the wait) | remote (NCCL: a peer's process "
                         "or the network failed) | other")
GROUP_RELEASED = _kind("group_released", RANK, ("secs",),
                       "the group let go; a reaper thread destroys it (one with a stuck op at the op's timeout)")
GROUP_REAPED = _kind("group_reaped", RANK, ("gen", "secs"),
                     "an abandoned group's threads ended and its sockets closed (at its timeout)")
BACKOFF = _kind("backoff", RANK, ("attempt", "seconds"), "sleeping before retry `attempt`")
HEALTH_CHECK = _kind("health_check", RANK, ("attempt", "ok", "detail"), "the check before a retry")
EXCLUDE = _kind("exclude", RANK, ("peers", "gen", "reasons"),
                "elastic: these members are left out of the next proposal")
RETRY = _kind("retry", RANK, ("attempt", "after_gen"), "re-joining after generation after_gen")
BREAKER_OPEN = _kind("breaker_open", RANK, ("reason",), "the circuit breaker opened")
REJOIN_REQUEST = _kind("rejoin_request", RANK, ("gen",),
                       "breaker open, this rank hears the control plane again and asks to be "
                       "let back in (gen: its last)")
REJOIN_ADMITTED = _kind("rejoin_admitted", RANK, ("gen", "waited_s"),
                        "generation gen includes it (waited_s since its breaker opened)")
REJOIN_FAILED = _kind("rejoin_failed", RANK, ("error",),
                      "the store failed while it asked or waited: it asks again once heard")
REJOIN_GAVE_UP = _kind("rejoin_gave_up", RANK, ("waited_s",),
                       "nobody let it in within rejoin_within: it leaves (exit isolated)")
ADMIT = _kind("admit", RANK, ("peers", "gen"),
              "group rank 0 agreed generation gen with these ranks let back in; every member "
              "moves there after the same step")
RESOURCES_RELEASED = _kind("resources_released", RANK,
                           ("outcome", "group", "cuda_reserved_before", "cuda_reserved_after",
                            "cuda_free_before", "cuda_free_after"),
                           "the rank let go of its group and accelerator memory "
                           "(torch.cuda.mem_get_info; null without CUDA)")
EXIT = _kind("exit", RANK, ("reason", "code"),
             "reason: stopped | failed-fast | retries-exhausted | isolated | terminated | crashed",
             optional=("error",))
# A user's job's checkpoint files, as the startup hook sees torch.save / torch.load and
# torch.distributed.checkpoint's save / load: file identifies what was written or read
# ({"ino", "mtime_ns", "size"} of the file, or of a distributed checkpoint's .metadata; null
# when it is no file), so that a load can be traced to the trial that wrote it (or to
# none: a file from before the trial) even after a temporary file was renamed into place.
CHECKPOINT_FILE_FIELDS = ("path", "step", "file")
CHECKPOINT_SAVE = _kind("checkpoint_save", RANK, CHECKPOINT_FILE_FIELDS,
                        "a user's job wrote a checkpoint: path (absolute) after `step` optimizer steps of "
                        "this process; api: torch.save | dcp (torch.distributed.checkpoint)",
                        optional=("local_rank", "api"))
CHECKPOINT_LOAD = _kind("checkpoint_load", RANK, CHECKPOINT_FILE_FIELDS,
                        "a user's job read a checkpoint (fields as checkpoint_save; file as it was "
                        "when the read began)", optional=("local_rank", "api"))
GROUP_INIT = _kind("group_init", RANK, ("gen", "world"),
                   "a user's job's process formed its default process group (the hook: "
                   "torch.distributed.init_process_group returned; gen: torchrun's restart count, "
                   "world: the group's size; local_rank: which of its host's processes)",
                   optional=("local_rank",))
GROUP_DESTROYED = _kind("group_destroyed", RANK, ("gen",),
                        "a user's job's process destroyed its process groups (the hook: "
                        "torch.distributed.destroy_process_group() returned): what follows is its "
                        "teardown", optional=("local_rank",))
JOB_OUTPUT = _kind("job_output", RANK, ("cause", "line"),
                   "the user's job printed an error line (runfolder.classify; t: when it "
                   "arrived); cause: watchdog | agent | heartbeat | quorum | timeout | reset | closed | "
                   "nccl | cuda")
HEAL = _kind("heal", RANK, ("step", "max_step", "source", "line"),
             "a framework's replica group is healed live from a peer (runfolder.classify, from its "
             "log line; t: when it arrived): at its step `step`, to the quorum's `max_step`, from "
             "replica rank `source`")
HEAL_FETCHED = _kind("heal_fetched", RANK, ("seconds", "line"),
                     "a healing replica group has fetched its peer's state (runfolder.classify, from the "
                     "framework's log line): in `seconds`, by its own count")
# what says a rank saw a fault: the time to detect counts from these (reports.metrics)
DETECTION_KINDS = (COLLECTIVE_ERROR, SUSPECT, JOB_OUTPUT)
# -- written by the harness ---------------------------------------------------------------
TRIAL_START = _kind("trial_start", HARNESS, ("policy", "ranks", "run_id", "backend", "hang_cap"),
                    "the trial began")
CLUSTER_UP = _kind("cluster_up", HARNESS, ("secs",),
                   "every host and the control plane are up (launcher: `kept`, the rank launcher an "
                   "earlier trial of the run gave back, torch already imported; `ahead`, started "
                   "when the run began; `new`, started for this trial; phases: seconds per phase "
                   "of the bring-up, the backend's own: hosts, launcher, control; a scheduler's "
                   "allocation, agents)", optional=("launcher", "phases"))
RANK_SPAWNED = _kind("rank_spawned", HARNESS, ("pid",), "rank `rank`'s process started")
WARMUP_DONE = _kind("warmup_done", HARNESS, ("step",),
                    "every rank made the warm-up steps; fault offsets count from here")
STEPS_NOT_OBSERVED = _kind("steps_not_observed", HARNESS, ("waited_s",),
                           "a user's job: no rank made a step within its start_timeout (waited_s) "
                           "while every rank's process lived; warm-up ends on time alone, fault "
                           "offsets count from here, and the trial is judged by exits alone")
# Traffic through the links (a fault on the network only; lists indexed by rank): bytes
# each rank's switch port carried both ways (chaos.linkstats) and the steps each rank made,
# over a window: before an apply, as long as the fault lasts (less when warm-up ended
# sooner); during, from the apply to the revert. allreduce_bytes: what one step all-reduces.
TRAFFIC_BEFORE = ("link_bytes_before", "steps_before", "before_s", "allreduce_bytes")
TRAFFIC_DURING = ("link_bytes_during", "steps_during", "during_s")
FAULT_APPLIED = _kind("fault_applied", HARNESS,
                      ("index", "fault_kind", "fault", "targets", "mechanism", "t_requested"),
                      "t: the kernel acknowledged the apply; t_requested: just before it; storage: "
                      "the checkpoint folder a storage fault acts on; reaches: the other ranks it "
                      "reached (a Slurm node's link fault reaches every rank of the node); anchor_t, "
                      "anchor_rank: the event an anchored fault started on (its t and rank; the fault "
                      "was due at anchor_t plus the anchor's delay)",
                      optional=(*TRAFFIC_BEFORE, "storage", "reaches", "anchor_t", "anchor_rank"))
FAULT_REVERTED = _kind("fault_reverted", HARNESS, ("index", "fault_kind", "targets"),
                       "t: the kernel acknowledged the revert; teardown: true when it was the "
                       "harness cleaning up, not the fault healing, and t when the revert began (the "
                       "harness stopped watching then: a rank it thawed may act before the kernel "
                       "acknowledges)", optional=("teardown", *TRAFFIC_DURING))
GPU_MEMORY_RELEASED = _kind("gpu_memory_released", HARNESS, ("breaker_t", "held"),
                            "rank `rank`'s process holds at most 512 MiB of GPU memory (NVML per "
                            "pid; 0 once it exited), watched from its breaker_open at breaker_t; "
                            "held: bytes at t. Never written where NVML cannot be asked")
GPU_MEMORY_FREED = _kind("gpu_memory_freed", HARNESS, ("killed_t", "killed_pid"),
                         "NVML no longer lists GPU memory for rank `rank`'s process killed_pid, "
                         "watched from its kill (the fault's apply) at killed_t. Written for ranks "
                         "on a GPU only, never where NVML cannot be asked")
RANK_EXITED = _kind("rank_exited", HARNESS, ("pid", "exitcode", "signal"),
                    "the harness reaped rank `rank`'s process; stopped: true when the harness "
                    "stopped it", optional=("stopped",))
FAULT_NOT_APPLIED = _kind("fault_not_applied", HARNESS, ("index", "fault_kind", "targets", "exited_t"),
                          "a process fault (kill, pause, gpu_hang) came due on ranks with no process "
                          "left: targets those ranks, exited_t when each one's process was reaped "
                          "(null: not known); the trial goes on. The fault's other targets, if any, "
                          "got it (fault_applied). waited_for: an anchored fault whose event never came "
                          "(the anchor in words; exited_t empty): its wait ended (its `until`, or the "
                          "trial ended first) at t", optional=("waited_for",))
HANG_DETECTED = _kind("hang_detected", HARNESS, ("cap", "idle_since"),
                      "no step and no policy action for `cap` seconds")
HOST_DROPS = _kind("host_drops", HARNESS, ("packets", "secs"),
                   "packets the hosts' kernel dropped with a CPU's receive backlog full "
                   "(net.core.netdev_max_backlog) in the secs from cluster up to the ranks' stop: "
                   "the whole machine's count, a loss no fault injected (none where the backend "
                   "has no such kernel)")
MACHINE_STEAL = _kind("machine_steal", HARNESS, ("steal_s", "cpus", "secs"),
                      "CPU seconds the virtual machine's host took from this machine's `cpus` "
                      "CPUs (/proc/stat's steal) in the secs from cluster up to the ranks' stop: "
                      "a slowness no fault injected (none where the kernel counts no steal)")
STACKS_CAPTURED = _kind("stacks_captured", HARNESS, ("reason", "processes", "dumped", "secs"),
                        "every process of every live rank host was dumped (py-spy) into the trial's "
                        "stacks/ folder: reason hung | cap (the hang cap, after everything measured "
                        "was recorded), or detect (at fault `fault`'s first detection, into "
                        "stacks/detect-<fault>/, no process paused; t: when the dumps ended); dumped of "
                        "processes; secs it took; flight (at the cap): the ranks asked for their flight "
                        "recorder (harness.job.flight: those that answered wrote flight/rNNN.json), "
                        "flight_answered: those whose dump came by the deadline (a stopped rank's may "
                        "come later, at teardown's SIGCONT, and is not what it held at the cap)",
                        optional=("flight", "fault", "flight_answered"))
STOPPING = _kind("stopping", HARNESS, (),
                 "the harness began to stop every rank still running (SIGTERM, then SIGKILL after "
                 "its deadline), its faults already reverted: what a rank does or says from here on "
                 "(a worker's error as its peers are stopped) is the teardown's, not the trial's")
AT_CAP = ("hung", "cap")  # stacks_captured reasons of the hang cap's capture
JOB_REQUEUED = _kind("job_requeued", HARNESS, ("restarts", "waited_s"),
                     "the scheduler started the job again after every rank had ended (a requeue, a "
                     "preemption with requeue, a node failure): its ranks start again from the top; "
                     "restarts: the scheduler's count (SLURM_RESTART_COUNT); waited_s: since the last "
                     "rank ended")
TRIAL_END = _kind("trial_end", HARNESS, ("reason",),
                  "reason: all-exited | settled (every live rank not frozen for good made the "
                  "settle steps) | held (every live rank frozen by a fault that "
                  "never heals) | hung | deadline | error | cap (steps not observed: ranks still "
                  "running hang_cap after the last fault action); error: with reason error, what "
                  "stopped it (the harness's error, `interrupted (SIGINT)`, `received SIGTERM`)",
                  optional=("error",))
# The anchors (a fault that starts on an event: harness.scenario.anchors) whose events only a
# failure brings after warm-up: a fault on one waits for another fault to cause it
# (runfolder.shrinking.uncaused; harness.scenario.anchors.AnchorEvent.after_failure)
AFTER_FAILURE_ANCHORS = frozenset({"restore", "detect", "retry", "new_generation", "rank_start", "breaker"})


def schema_problems(event: dict[str, Any]) -> list[str]:
    """How one event differs from SCHEMA: an unknown kind, a wrong source, a missing or an
    unknown field. Empty when it conforms."""
    kind = SCHEMA.get(event.get("kind"))  # type: ignore[arg-type]
    if kind is None:
        return [f"unknown kind {event.get('kind')!r}"]
    problems = [f"{kind.name}: missing {name}" for name in (*COMMON_FIELDS, *kind.fields) if name not in event]
    if event.get("src") != kind.src:
        problems.append(f"{kind.name}: src {event.get('src')!r}, expected {kind.src!r}")
    unknown = set(event) - {*COMMON_FIELDS, *kind.fields, *kind.optional}
    return problems + [f"{kind.name}: unknown field {name}" for name in sorted(unknown)]


CLOCK_OFFSET_ENV = "CHAOS_CLOCK_OFFSET"


class EventRecorder:
    def __init__(self, path: Path | str, source: str, rank: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.source = source
        self.rank = rank
        self.clock = clock
        self.offset = float(os.environ.get(CLOCK_OFFSET_ENV) or 0.0)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(self, kind: str, t: float | None = None, **fields: Any) -> float:
        """Write one event now (or at the given monotonic time); returns its time on this
        process's clock (the line holds it on the harness's)."""
        t = self.clock() if t is None else t
        record = {"t": round(t - self.offset, 6), "src": self.source, "rank": self.rank, "pid": os.getpid(),
                  "kind": kind, **fields}
        os.write(self._fd, (json.dumps(record, default=str) + "\n").encode())
        return t

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_events(path: Path | str, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Complete lines from byte `offset` on; returns them and the offset after the last one."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a SIGKILL mid-write
        if isinstance(record, dict):
            events.append(record)
    return events, offset + end
