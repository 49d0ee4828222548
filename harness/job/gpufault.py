"""The rank's side of the gpu_hang fault: play each command of the harness once, as a
kernel that spins on the rank's GPU.

chaos.cmdfile writes a command for a target rank into the trial folder
(`command_file(trial folder, rank)`; the run folder is bind-mounted at the same path in
containers). A CUDA rank runs a daemon thread of its own beside the training (harness.job.rank
starts it; the detector's digest thread exists only under a failure detector, so it cannot
be the one) that looks for that file every POLL_S and plays a command it has not played yet (by
its id): one kernel that spins until the command's `until` (monotonic, the clock every
process of the kernel shares), queued on the stream the training uses. The step's next
kernels wait behind it and its next synchronisation blocks there, so the rank stops making
progress while its process, its heart (heartbeats) and its link stay alive: a silent fault,
like pause. A command read after its `until` is not played. A queued kernel cannot be
stopped: a revert before its end (teardown) only removes the file.

How many cycles a second is measured once, when the thread starts, by timing short spins
with CUDA events on that stream until the clock has settled: the nominal clock is the
boost clock, and the spin counts SM cycles at the clock the GPU runs under load. The spinning function is injected
(`spin_kernel` on CUDA; a fake in the CPU tests), as the runner's accelerator hooks are.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from chaos.cmdfile import command_path

POLL_S = 0.02
COMMANDS_DIR = "commands"      # in a trial's folder
CALIBRATION_CYCLES = 50_000_000  # ~25-50 ms at the 1-2 GHz of a data-centre GPU
CALIBRATION_TRIES = 8
CALIBRATION_AGREE = 0.03  # two timings this close: the clock has settled
KIND = "gpu_hang"


def commands_dir(trial_dir: Path) -> Path:
    """Where the harness writes the trial's commands (chaos.cmdfile.CommandFile's directory)."""
    return trial_dir / COMMANDS_DIR


def command_file(trial_dir: Path, rank: int) -> Path:
    """The gpu_hang command file of `rank` (its host is named rNNN)."""
    return command_path(commands_dir(trial_dir), f"r{rank:03d}", KIND)


@dataclass(frozen=True)
class Played:
    id: str
    seconds: float  # the spin queued: from reading the command until its `until`


class HangWatcher:
    """Plays each command in `path` once: `spin(seconds)` queues the kernel."""

    def __init__(self, path: Path, spin: Callable[[float], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.spin = spin
        self.clock = clock
        self._seen: set[str] = set()

    def poll(self) -> Played | None:
        """Play the command in the file if it is new and not over; what was played, or None."""
        try:
            command = json.loads(self.path.read_text())  # written whole (renamed into place)
        except FileNotFoundError:
            return None
        if command["id"] in self._seen:
            return None
        self._seen.add(command["id"])
        seconds = command["until"] - self.clock()
        if seconds <= 0:
            return None
        self.spin(seconds)
        return Played(command["id"], seconds)

    def start(self, stop: threading.Event) -> threading.Thread:
        """Poll every POLL_S from a daemon thread until `stop` is set (the process's end, in a rank)."""
        def run() -> None:
            while not stop.wait(POLL_S):
                played = self.poll()
                if played is not None:
                    print(f"gpu_hang {played.id}: a kernel spins {played.seconds:.3f} s on this rank's GPU",
                          file=sys.stderr, flush=True)

        thread = threading.Thread(target=run, name="gpu-commands", daemon=True)
        thread.start()
        return thread


def spin_kernel(stream: Any, cuda: Any) -> Callable[[float], None]:
    """`spin(seconds)`: queue torch.cuda._sleep for that long on `stream` (`cuda`: torch.cuda),
    at the cycle rate measured now on that stream."""
    hz = cycles_per_second(stream, cuda)

    def spin(seconds: float) -> None:
        with cuda.stream(stream):
            cuda._sleep(max(1, round(seconds * hz)))
    return spin


def cycles_per_second(stream: Any, cuda: Any) -> float:
    """The spin kernel's cycles per second on `stream` at the clock the GPU reaches under
    load, timed with CUDA events: an idle GPU's clock rises while the first spins run (on
    the first GPU run a rate from the first timing made a 1.0 s spin last 0.73 s), so the
    spin is timed until two timings agree within CALIBRATION_AGREE (at most
    CALIBRATION_TRIES) and the fastest rate is taken."""
    rates: list[float] = []
    for _ in range(CALIBRATION_TRIES):
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        with cuda.stream(stream):
            start.record()
            cuda._sleep(CALIBRATION_CYCLES)
            end.record()
        end.synchronize()
        rates.append(CALIBRATION_CYCLES / (start.elapsed_time(end) / 1e3))  # elapsed_time: milliseconds
        if len(rates) >= 2 and abs(rates[-1] - rates[-2]) <= CALIBRATION_AGREE * rates[-1]:
            break
    return max(rates)
