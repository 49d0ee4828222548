"""Fidelity of the FUSE storage kinds (chaos.fusefs), configured against measured, by file
calls of this process in a scratch folder under the harness's own mount (applied through the
injector and its ledger, as a trial's):

    io_delay       the added latency per read, write and fsync: each call timed with the
                   fault on, minus the median of the same calls with it off (the
                   passthrough's own cost), rounds interleaved; median within 1 ms of the
                   latency (as the network delay's bar), p95 within 5 ms, and every call
                   held by the daemon (its count)
    io_error       `percent`: the share of 5,000 writes that failed within 2 points (as a
                   loss); `every_nth`: exactly the nth, 2nth, ... write and fsync failed;
                   every failure with the errno asked
    io_stall       calls made while it is on are still blocked when it ends (held at least
                   the time asked), go on within 50 ms of its end, and complete
    lose_unsynced  at its end (the crash) an fsynced file and a renamed fsynced one keep
                   their bytes, a file written but never fsynced is empty, and one
                   overwritten without an fsync holds what it held before

Reads are timed on a descriptor opened for each read: FUSE drops a file's cached pages at
its open, so every read reaches the daemon (a second read of the same pages on one
descriptor is served from the page cache, and no `read` fault sees it).
Needs FUSE (chaos.fusefs.why_no_fuse): as an ordinary user's root of a user namespace,
/dev/fuse is the initial namespace's and its mode decides; the figure says so.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections import Counter
from typing import Any, Callable, Iterator

from chaos.api import Host
from chaos.faults import DiskFull, FaultBase, IoDelay, IoError, IoStall, LoseUnsynced, ReadOnly, parse_fault
from chaos.fidelity import Family, Figure, not_measured, owned
from chaos.fusefs import control, control_name
from chaos.inject import NetlinkInjector, process_mechanisms
from chaos.ledger import Ledger
from chaos.storage import mounted
from chaos import units

BLOCK = b"c" * 4096
DELAY_ROUNDS, DELAY_CALLS = 5, 10        # per operation: 50 calls on, 50 off
ERROR_CALLS, NTH_CALLS = 5000, 30
STALL_S, RESUME_WITHIN_S = 1.0, 0.050
FILL_CAP = 4 * 1024 * 1024             # bytes a fill writes at most: past it, no ENOSPC came
NEEDS_FUSE = "the storage kinds need the FUSE passthrough (root, or /dev/fuse open to the user): "


@contextlib.contextmanager
def scratch_folder(run_id: str, ledger: Ledger) -> Iterator[tuple[NetlinkInjector, Host]]:
    """A folder of its own as a rank's checkpoint folder; removed after (not while a mount
    is left on it: a heal of the run takes that first)."""
    folder = tempfile.mkdtemp(prefix=f"chaos-{run_id}-storage-")
    try:
        with owned(ledger):
            yield (NetlinkInjector(ledger, process_mechanisms()),
                   Host("r000", "10.0.0.1", None, None, None, storage=folder))
    finally:
        if not mounted(folder):
            shutil.rmtree(folder, ignore_errors=True)


def _switch(host: Host, ledger: Ledger, command: str) -> dict[str, Any]:
    """`on`, `off` or `stats` to the daemon of the host's folder; its answer."""
    return control(control_name(ledger.run_id, os.path.realpath(host.storage or "")), command)


def _timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _read_time(path: str) -> float:
    """Seconds of one read on a descriptor of its own (its open dropped the cached pages)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return _timed(lambda: os.pread(fd, len(BLOCK), 0))
    finally:
        os.close(fd)


def _call_times(path: str, ops: tuple[str, ...], calls: int) -> dict[str, list[float]]:
    """Seconds of `calls` of each op (reads each on a fresh descriptor). The fsyncs are of
    a file of their own that nothing writes: FUSE sends each one to the daemon all the same,
    and the disk's own flush (milliseconds, as the machine's other I/O has it) stays out."""
    times: dict[str, list[float]] = {op: [] for op in ops}
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    clean = os.open(path + ".clean", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for _ in range(calls):
            if "write" in ops:
                times["write"].append(_timed(lambda: os.pwrite(fd, BLOCK, 0)))
            if "fsync" in ops:
                times["fsync"].append(_timed(lambda: os.fsync(clean)))
            if "read" in ops:
                times["read"].append(_read_time(path))
    finally:
        os.close(fd)
        os.close(clean)
    return times


def delay_verdict(latency: float, on: list[float], off: list[float]) -> tuple[float, float, bool]:
    """Added median and p95 (the fault's calls minus the passthrough's median without it),
    and whether they are within 1 ms and 5 ms of `latency`."""
    base = statistics.median(off)
    median = statistics.median(on) - base
    p95 = statistics.quantiles(on, n=20)[-1] - base
    return median, p95, abs(median - latency) <= 0.001 and abs(p95 - latency) <= 0.005


def _io_delay(injector: NetlinkInjector, host: Host, fault: IoDelay) -> tuple[str, bool]:
    injection = injector.apply(fault, [host])
    on: dict[str, list[float]] = {op: [] for op in fault.ops}
    off: dict[str, list[float]] = {op: [] for op in fault.ops}
    path = os.path.join(host.storage or "", "delayed.bin")
    try:
        for _ in range(DELAY_ROUNDS):  # interleaved: a busy moment of the machine hits both
            for state, times in (("off", off), ("on", on)):
                _switch(host, injector.ledger, state)
                for op, got in _call_times(path, fault.ops, DELAY_CALLS).items():
                    times[op].extend(got)
        held = _switch(host, injector.ledger, "stats")["counts"]  # calls the daemon held, per op
    finally:
        injection.revert()
    calls = DELAY_ROUNDS * DELAY_CALLS
    parts, ok = [], True
    for op in fault.ops:
        median, p95, op_ok = delay_verdict(fault.latency, on[op], off[op])
        ok = ok and op_ok and held.get(f"{op}_matched") == calls
        parts.append(f"{op} +{median * 1000:.2f} ms median, +{p95 * 1000:.2f} ms p95 "
                     f"(passthrough alone {statistics.median(off[op]) * 1000:.2f} ms)"
                     + ("" if held.get(f"{op}_matched") == calls else
                        f", {held.get(f'{op}_matched', 0)} of the {calls} reached the daemon"))
    return f"{'; '.join(parts)}; {calls} calls each", ok


def _failures(path: str, ops: tuple[str, ...], calls: int) -> tuple[dict[str, list[int]], Counter[int]]:
    """Per op, the numbers (from 1) of the calls that failed; and the errnos seen."""
    failed: dict[str, list[int]] = {op: [] for op in ops}
    seen: Counter[int] = Counter()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for n in range(1, calls + 1):
            for op, call in (("write", lambda: os.pwrite(fd, BLOCK, 0)), ("fsync", lambda: os.fsync(fd))):
                if op not in ops:
                    continue
                try:
                    call()
                except OSError as exc:
                    failed[op].append(n)
                    seen[exc.errno] += 1
    finally:
        os.close(fd)
    return failed, seen


def _errnos(seen: Counter[int]) -> str:
    return ", ".join(f"{errno.errorcode.get(code, code)} x{count}" for code, count in sorted(seen.items()))


def _io_error(injector: NetlinkInjector, host: Host, fault: IoError) -> tuple[str, bool]:
    calls = NTH_CALLS if fault.every_nth is not None else ERROR_CALLS
    injection = injector.apply(fault, [host])
    try:
        failed, seen = _failures(os.path.join(host.storage or "", "failing.bin"), fault.ops, calls)
    finally:
        injection.revert()
    right_errno = set(seen) <= {fault.errno} and bool(seen)
    if fault.every_nth is not None:
        expected = list(range(fault.every_nth, calls + 1, fault.every_nth))
        exact = all(failed[op] == expected for op in fault.ops)
        which = "; ".join(f"{op} {','.join(map(str, failed[op])) or 'none'} failed" for op in fault.ops)
        return f"of {calls} calls each: {which}; errno {_errnos(seen) or 'none'}", exact and right_errno
    share = sum(len(f) for f in failed.values()) / (calls * len(fault.ops))
    return (f"{share:.1%} of {calls * len(fault.ops)} {'/'.join(fault.ops)} calls failed; errno "
            f"{_errnos(seen) or 'none'}", abs(share - (fault.percent or 1.0)) <= 0.02 and right_errno)


def stall_verdict(ended: dict[str, float | None], ok: dict[str, bool]) -> bool:
    """Every call returned (and succeeded) after the fault's end, within RESUME_WITHIN_S of
    it; `ended`: each call's return, in seconds after the end (None: it never returned;
    below 0: it went through the stall)."""
    return all(t is not None and 0 <= t <= RESUME_WITHIN_S for t in ended.values()) and all(ok.values())


def _io_stall(injector: NetlinkInjector, host: Host, fault: IoStall) -> tuple[str, bool]:
    folder = host.storage or ""
    calls: dict[str, Callable[[int], Any]] = {}
    if "write" in fault.ops:
        calls["write"] = lambda fd: os.pwrite(fd, BLOCK, 0)
    if "fsync" in fault.ops:
        calls["fsync"] = os.fsync
    if "read" in fault.ops:
        calls["read"] = lambda fd: os.pread(fd, len(BLOCK), 0)
    for op in calls:  # each call on a file of its own that exists before the fault
        with open(os.path.join(folder, f"stalled-{op}.bin"), "wb") as f:
            f.write(BLOCK)
    returned: dict[str, float] = {}
    succeeded: dict[str, bool] = {op: False for op in calls}
    injection = injector.apply(fault, [host])

    def one(op: str) -> None:
        fd = os.open(os.path.join(folder, f"stalled-{op}.bin"), os.O_RDWR)
        try:
            calls[op](fd)
            succeeded[op] = True
        except OSError:
            pass
        finally:
            returned[op] = time.monotonic()
            os.close(fd)

    threads = [threading.Thread(target=one, args=(op,), daemon=True) for op in calls]
    for thread in threads:
        thread.start()
    # the clock starts once the daemon holds every call: the fault's window, as asked
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        counts = _switch(host, injector.ledger, "stats")["counts"]
        if all(counts.get(f"{op}_matched", 0) >= 1 for op in calls):
            break
        time.sleep(0.005)
    held_from = time.monotonic()
    time.sleep(STALL_S)
    end = time.monotonic()
    injection.revert()
    for thread in threads:
        thread.join(5.0)
    ended = {op: (returned[op] - end if op in returned else None) for op in calls}
    ok = stall_verdict(ended, succeeded)
    parts = []
    for op in calls:
        if ended[op] is None:
            parts.append(f"{op} never returned")
        else:
            parts.append(f"{op} blocked {returned[op] - held_from:.3f} s, returned "
                         f"{ended[op] * 1000:+.1f} ms after the end{'' if succeeded[op] else ', failed'}")
    return "; ".join(parts), ok


def _lose_unsynced(injector: NetlinkInjector, host: Host, fault: LoseUnsynced) -> tuple[str, bool]:
    folder = host.storage or ""
    before, during = b"b" * 4096, b"d" * 8192

    def write(name: str, data: bytes, sync: bool) -> None:
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())

    write("overwritten.bin", before, True)
    injection = injector.apply(fault, [host])
    try:
        write("fsynced.bin", during, True)
        write("unsynced.bin", during, False)
        write("overwritten.bin", during, False)
        write(".tmp-renamed", during, True)
        os.rename(os.path.join(folder, ".tmp-renamed"), os.path.join(folder, "renamed.bin"))
    finally:
        injection.revert()  # the fault's end: the crash
    expected = {"fsynced.bin": during, "renamed.bin": during, "unsynced.bin": b"", "overwritten.bin": before}
    seen = {}
    for name in expected:
        try:
            with open(os.path.join(folder, name), "rb") as f:
                seen[name] = f.read()
        except FileNotFoundError:
            seen[name] = None

    def said(name: str) -> str:
        got = seen[name]
        if got is None:
            return f"{name} gone"
        if got == during:
            return f"{name} holds its {len(got)} bytes written during the fault"
        if got == before:
            return f"{name} holds its {len(got)} bytes from before the fault"
        return f"{name} {len(got)} bytes" + ("" if got else " (empty)")

    return "; ".join(said(name) for name in expected), seen == expected


def _fill(path: str) -> tuple[int, int | None]:
    """Bytes a new file took before a write failed, and that write's errno (None: it never
    failed within FILL_CAP bytes)."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while written < FILL_CAP:
            try:
                written += os.write(fd, BLOCK)
            except OSError as exc:
                return written, exc.errno
    finally:
        os.close(fd)
    return written, None


def _disk_full(injector: NetlinkInjector, host: Host, fault: DiskFull) -> tuple[str, bool]:
    folder = host.storage or ""
    # files of this measurement's own: truncating one an earlier measurement left would free
    # room the fault's cap then counts
    own = tempfile.mkdtemp(prefix="disk_full-", dir=folder)
    kept, filling = os.path.join(own, "before.bin"), os.path.join(own, "filling.bin")
    with open(kept, "wb") as f:
        f.write(BLOCK * 4)
    injection = injector.apply(fault, [host])
    try:
        written, failed = _fill(filling)
        with open(kept, "rb") as f:
            intact = f.read() == BLOCK * 4
    finally:
        injection.revert()
    again, _ = _fill(os.path.join(own, "after.bin")) if failed is not None else (0, None)
    budget = fault.after_bytes or 0
    with open(kept, "rb") as f:
        kept_after = f.read() == BLOCK * 4
    ok = (failed == errno.ENOSPC and budget <= written < budget + len(BLOCK) and intact and kept_after
          and again == FILL_CAP and os.path.getsize(filling) == written)
    refused = errno.errorcode.get(failed or 0, "no error") if failed is not None else f"none in {FILL_CAP} bytes"
    return (f"{written} bytes written, then {refused}; the file from before "
            f"{'kept' if intact and kept_after else 'changed'}; after the end the written bytes are "
            f"there and {again} more went in"), ok


def _read_only(injector: NetlinkInjector, host: Host, fault: ReadOnly) -> tuple[str, bool]:
    folder = host.storage or ""
    kept = os.path.join(folder, "before.bin")
    with open(kept, "wb") as f:
        f.write(BLOCK)
    calls: dict[str, Callable[[], Any]] = {
        "create": lambda: os.close(os.open(os.path.join(folder, "new.bin"), os.O_WRONLY | os.O_CREAT, 0o644)),
        "write": lambda: os.close(os.open(kept, os.O_WRONLY)),
        "rename": lambda: os.rename(kept, os.path.join(folder, "renamed.bin")),
        "remove": lambda: os.unlink(kept),
    }
    refused: dict[str, str] = {}
    injection = injector.apply(fault, [host])
    try:
        for op, call in calls.items():
            try:
                call()
                refused[op] = "went through"
            except OSError as exc:
                refused[op] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        with open(kept, "rb") as f:
            readable = f.read() == BLOCK
    finally:
        injection.revert()
    writable, _ = _fill(os.path.join(folder, "after.bin"))
    ok = all(v == "EROFS" for v in refused.values()) and readable and writable == FILL_CAP
    return (f"{', '.join(f'{op} {v}' for op, v in refused.items())}; read "
            f"{'ok' if readable else 'failed'}; after the end a write {'went in' if writable == FILL_CAP else 'failed'}"), ok


MEASURERS: dict[str, Callable[[NetlinkInjector, Host, Any], tuple[str, bool]]] = {
    "io_delay": _io_delay, "io_error": _io_error, "io_stall": _io_stall, "lose_unsynced": _lose_unsynced,
    "disk_full": _disk_full, "read_only": _read_only,
}
CONFIGURED: dict[str, Callable[[Any], str]] = {
    "io_delay": lambda f: f"{units.format_duration(f.latency)} per {'/'.join(f.ops)} call",
    "io_error": lambda f: (f"every_nth {f.every_nth}: calls {f.every_nth}, {2 * f.every_nth}, ..."
                           if f.every_nth else f"{f.percent:.0%} of calls") + f" fail with {errno.errorcode[f.errno]}",
    "io_stall": lambda f: f"calls held {units.format_duration(STALL_S)}, then go on (within "
    f"{RESUME_WITHIN_S * 1000:.0f} ms of the end)",
    "lose_unsynced": lambda f: "at the end, only what was fsynced stays",
    "disk_full": lambda f: (f"ENOSPC once {f.after_bytes} more bytes are written (rounded up to a 4 KiB page)"
                            if f.after_bytes else "ENOSPC on the first write") + "; what was there stays",
    "read_only": lambda f: "create, write, rename and remove fail with EROFS; reads go on",
}


def measure(setting: tuple[NetlinkInjector, Host], spec: dict[str, Any]) -> Figure:
    injector, host = setting
    fault: FaultBase = parse_fault(spec)
    refused = not_measured(injector, fault, host, "" if isinstance(fault, (DiskFull, ReadOnly)) else NEEDS_FUSE)
    if refused:
        return refused
    measured, ok = MEASURERS[spec["kind"]](injector, host, fault)
    return Figure(fault.describe(), injector.mechanism(fault), CONFIGURED[spec["kind"]](fault), measured, ok)


STORAGE = Family(
    specs=(
        {"kind": "io_delay", "latency": "20ms", "ops": ["read", "write", "fsync"]},
        {"kind": "io_error", "percent": "20%", "ops": ["write"]},
        {"kind": "io_error", "every_nth": 3, "errno": "ENOSPC", "ops": ["write", "fsync"]},
        {"kind": "io_stall", "ops": ["read", "write", "fsync"]},
        {"kind": "lose_unsynced"},
        {"kind": "disk_full", "after_bytes": "300kib"},
        {"kind": "disk_full"},
        {"kind": "read_only"},
    ),
    scratch=scratch_folder,
    measure=measure,
)
