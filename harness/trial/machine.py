"""How fast this machine is, measured in a fraction of a second and printed or stored beside
the figures of a run (run.json's `machine`: runfolder.info.MachineSpeed), a bench or a
night, so that a slower machine (or a slower day of the same shared one) is not taken for
slower code.

    loop_ns   one step of a pure-Python loop, the best of LOOP_REPEATS (5) runs: one core's
              speed at the ranks' and the harness's Python
    wake_us   a round trip between two processes on one CPU over pipes, the median of
              WAKE_ROUNDS (1000): what a ring all-reduce on few cores waits on (each hop wakes
              another process). On one CPU because across two it mostly measured how fast an
              idle virtual CPU wakes: on the 2-core build machine 17-22 us idle and 6-10 us
              while a test suite kept both CPUs busy, against 5.5-8 us on one CPU idle (9-11
              us beside two busy processes).

    fault_us  a page's first touch: the time to write one byte to each 4 KiB page of fresh
              anonymous memory (a minor page fault: the kernel allocates and zeroes the page),
              the best of FAULT_REPEATS (3) over FAULT_MIB (16) MiB. What a rank's start-up
              pays thousands of times (a fork, then copy-on-write of the launcher's pages) and
              the loop step, which runs in the CPU's cache, does not: the same code can bring 64
              ranks up in twice the time with the loop step unchanged, when a fork of a process
              with torch imported takes twice as long (docs/scale-journal.md).

All three grow with the load of other work, so the line gives the load average beside them.

On the 2-core build machine the same code gave a 64-rank bring-up of 2.41-2.46 s one
afternoon and 4.19 s that evening, with nothing else running (docs/scale-journal.md): without such
a line the two read as a regression.
"""
from __future__ import annotations

import json
import mmap
import os
import select
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from chaos.errors import DeadlineExceeded
from runfolder.info import MachineSpeed

LOOP_STEPS = 200_000
LOOP_REPEATS = 5
WAKE_ROUNDS = 1000
WAKE_DEADLINE_S = 10.0  # the echo process's start and every round trip, together
FAULT_MIB = 16
FAULT_REPEATS = 3
PAGE = mmap.PAGESIZE
MACHINE_FILE = "machine.json"  # in a bench's output folder: the speed measured as it began
# The echo process, started with -I -S so that it starts in milliseconds and reads no site packages.
ECHO = "import os\nwhile os.read(0, 1):\n    os.write(1, b'.')\n"


def measure() -> MachineSpeed:
    """This machine's speed now (about 0.2 s on the build machine)."""
    return MachineSpeed(cpus=len(os.sched_getaffinity(0)), model=cpu_model(), loop_ns=round(loop_ns(), 1),
                        wake_us=round(wake_us(), 2), load_1m=round(os.getloadavg()[0], 2),
                        fault_us=round(fault_us(), 2))


def measure_or_why() -> MachineSpeed | str:
    """The speed now, or why it could not be measured (a run, a bench or a night goes on without it)."""
    try:
        return measure()
    except (DeadlineExceeded, OSError) as exc:
        return f"not measured ({exc})"


def line_now() -> str:
    """The line a bench or `chaos doctor` prints: the speed now, or why it is not known."""
    speed = measure_or_why()
    return f"machine: {speed if isinstance(speed, str) else speed.describe()}"


def steal_s(stat: Path = Path("/proc/stat")) -> float | None:
    """CPU seconds the hypervisor has taken from this machine since boot, all CPUs together
    (the `cpu` line's eighth value, in USER_HZ ticks); None where the kernel counts none."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if fields[:1] != ["cpu"] or len(fields) < 9:
        return None
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return ""
    return next((line.partition(":")[2].strip() for line in lines if line.startswith("model name")), "")


def loop_ns(steps: int = LOOP_STEPS, repeats: int = LOOP_REPEATS) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        total = 0
        for i in range(steps):
            total += i
        best = min(best, time.perf_counter() - started)
    return best / steps * 1e9


def fault_us(mib: int = FAULT_MIB, repeats: int = FAULT_REPEATS) -> float:
    """The best mean time, in microseconds, to write one byte to each page of `mib` MiB of
    fresh anonymous memory, each page faulted in on its first write. Not backed by huge pages
    (MADV_NOHUGEPAGE), so that a fault is one 4 KiB page whatever the kernel's THP setting."""
    size, best = mib << 20, float("inf")
    for _ in range(repeats):
        with mmap.mmap(-1, size) as memory:
            memory.madvise(mmap.MADV_NOHUGEPAGE)
            started = time.perf_counter()
            for offset in range(0, size, PAGE):
                memory[offset] = 1
            best = min(best, time.perf_counter() - started)
    return best / (size // PAGE) * 1e6


def wake_us(rounds: int = WAKE_ROUNDS, echo_code: str = ECHO, deadline_s: float = WAKE_DEADLINE_S) -> float:
    """The median round trip of one byte to an echo process and back, in microseconds, with
    both on this thread's first CPU (the echo process inherits it; the thread gets its own
    CPUs back at the end)."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        echo = subprocess.Popen([sys.executable, "-I", "-S", "-c", echo_code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, bufsize=0)
        return _round_trips(echo, rounds, deadline_s)
    finally:
        os.sched_setaffinity(0, cpus)


def _round_trips(echo: subprocess.Popen[bytes], rounds: int, deadline_s: float) -> float:
    assert echo.stdin is not None and echo.stdout is not None
    to_echo, from_echo = echo.stdin.fileno(), echo.stdout.fileno()
    deadline = time.monotonic() + deadline_s
    trips = []
    try:
        for _ in range(rounds + 1):  # the first round waits for the echo process to start
            started = time.perf_counter()
            os.write(to_echo, b".")
            if not select.select([from_echo], [], [], max(0.0, deadline - time.monotonic()))[0] \
                    or not os.read(from_echo, 1):
                raise DeadlineExceeded(f"measuring the machine's speed: the echo process "
                                       f"({sys.executable}) did not answer within {deadline_s:g} s")
            trips.append(time.perf_counter() - started)
    finally:
        echo.kill()
        echo.communicate()
    return statistics.median(trips[1:]) * 1e6


def record(out: Path) -> MachineSpeed | str:
    """Measure now and keep the figures (or why there are none) in `out` for the bench's --analyze."""
    speed = measure_or_why()
    kept = {"not_measured": speed} if isinstance(speed, str) else asdict(speed)
    (Path(out) / MACHINE_FILE).write_text(json.dumps(kept) + "\n")
    return speed


def recorded_line(out: Path) -> str:
    """The line a bench prints under its table: the speed kept in `out`, or why there is none."""
    path = Path(out) / MACHINE_FILE
    try:
        kept = json.loads(path.read_text())
        return f"machine: {kept['not_measured'] if 'not_measured' in kept else MachineSpeed(**kept).describe()}"
    except FileNotFoundError:
        return f"machine: not recorded (no {path.name}: written by a bench before it kept the machine's speed)"
    except (OSError, ValueError, TypeError) as exc:
        return f"machine: {path} unreadable ({exc})"
