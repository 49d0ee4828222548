"""Error lines of a training job's output, classified: which kind of failure a line reports.

`classify_line(line)` is the cause of the first rule whose pattern the line matches, or None
for an ordinary line. The causes are those of `job_output` events (runfolder.events):

    watchdog   NCCL's watchdog caught a collective timeout or is taking the process down
    timeout    a collective, a store or a rendezvous timed out (gloo, NCCL, TCPStore, c10d)
    reset      a connection reset by the peer, a broken pipe
    closed     a connection closed by the peer or refused, a peer process gone
    nccl       any other NCCL error (a remote process exited, a network error, two ranks on one GPU)
    cuda       a CUDA error (a device-side assert, out of memory) that no NCCL line explains
    agent      the torchrun agent (or ft_launcher) saw a worker fail, restarts its worker
               group or gives up
    heartbeat  a framework's monitor missed a worker's heartbeat (ft_launcher's rank
               monitor: "Did not get subsequent heartbeat. Waited 5.00 seconds.")
    section    a framework's monitor saw a worker's timed section open too long, or the
               worker outside every section too long (ft_launcher's rank monitor: "Section
               'step' has been open for 3.15 seconds. Timeout is 3.00 seconds.")
    quorum     a framework saw its membership change (torchft: the Lighthouse or a Manager
               detected a quorum change), a step it could not commit, or its coordinator
               gone (torchft: a Manager could not reach the Lighthouse)

Not error lines, though they say "timed out": torch's c10d "waitForInput" warnings, a socket
poll inside a store call that goes on waiting (nvidia-resiliency-ext's Wrapper prints one a
second per rank while its ranks start and while they wait for each other). The order
matters: a watchdog line also says "timeout"; the rules are tried top-down. A
Python traceback is not an error line by itself: its last line is (classified by its text),
and an exception nobody caught ends the process, which the harness sees as an exit.
"""
from __future__ import annotations

import re

RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((cause, re.compile(pattern, re.IGNORECASE)) for cause, pattern in (
    ("watchdog", r"watchdog caught collective operation timeout|taking the entire process down"
                 r"|watchdog thread terminated"),
    ("agent", r"failed \(exitcode: -?\d+\) local_rank|worker group (failed|unhealthy)"
              r"|restarting worker group|will restart worker group|ChildFailedError|RendezvousClosedError"),
    ("heartbeat", r"Did not get (initial|subsequent) heartbeat"),
    ("section", r"Section '[^']*' has been open for|Was out of section for"),
    ("quorum", r"Detected quorum change|should_commit=False|lighthouse quorum failed"
               r"|Failed to send heartbeat to lighthouse"),
    ("timeout", r"timed out|connect timeout|timeout\(ms\)|socket timeout|DistStoreError"),
    ("reset", r"connection reset|broken pipe"),
    ("closed", r"connection closed|connection refused|failed to recv, got 0 bytes"
               r"|remote process exited|connection was likely closed"),
    ("nccl", r"NCCL error|ncclSystemError|ncclRemoteError|ncclInternalError|ncclInvalidUsage"
             r"|ncclUnhandledCudaError|Duplicate GPU detected"),
    ("cuda", r"CUDA error:|CUDA out of memory|AcceleratorError"),
))


# torchft's Manager, as a replica group that must heal begins: "healing is required step=0,
# max_step=93, recover_src_replica_rank=0"
HEAL_LINE = re.compile(r"healing is required step=(\d+), max_step=(\d+), recover_src_replica_rank=(\d+)")


# torchft's HTTP checkpoint transport, once a healing group has its peer's state: "fetching
# checkpoint from http://10.77.0.10:33373/checkpoint/1/full took 0.011888380000527832s"
FETCH_LINE = re.compile(r"fetching checkpoint from \S+ took ([0-9.]+(?:e-?\d+)?)s")


def heal_fetch_of(line: str) -> float | None:
    """How long a framework's heal took to fetch its peer's state, as a line says, or None."""
    found = FETCH_LINE.search(line)
    return None if found is None else float(found.group(1))


def heal_of(line: str) -> dict[str, int] | None:
    """A framework's heal that an output line reports (the `heal` event's fields), or None."""
    found = HEAL_LINE.search(line)
    if found is None:
        return None
    step, max_step, source = (int(g) for g in found.groups())
    return {"step": step, "max_step": max_step, "source": source}


NOT_ERRORS = re.compile(r"\[c10d\] waitForInput: ")


def classify_line(line: str) -> str | None:
    """The cause an output line reports (see the module's list), or None."""
    if NOT_ERRORS.search(line):
        return None
    for cause, pattern in RULES:
        if pattern.search(line):
            return cause
    return None
