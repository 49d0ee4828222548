"""How many ranks one control plane serves: its CPU and whether its digests stay on time,
with N ranks beating on loopback (no root, no namespaces).

    .venv/bin/python bench/control_plane.py [--ranks 64 256 1024] [--seconds 10] [--tree DIR]...

The control plane is the real one (`harness.job.control.main`: the rendezvous store and
the failure detector's heartbeat server, in a process of its own, at nice -10 where this
may), bound to 127.0.0.1. The ranks are stand-ins: one process sends every rank's
heartbeats from its own UDP socket, each on its own schedule (the detector's interval,
spread evenly over it), and holds each rank's TCP lease (announcing the default detector's
floor: `harness.job.detector.floor_for`), as a rank's heart and client do.
Eight of them read every digest (at most 8 s of a 1024-rank job's digests are 170 MB);
the others' receive buffers are too small for one, so the kernel drops theirs, after the
server has paid for sending it.

Prints, per size: the server's CPU (share of one core), a digest's mean size and the
bytes the server sends per second (every rank gets every digest), the gap between digests
at the readers (the server sends one every TICK_S), the longest silence a digest reported
for a rank that was beating (a rank is suspect after `suspect_after`, 0.4 s by default: a
digest that says more raises a false alarm; under the floor it says none), and whether the
stand-ins kept their schedule (if they did not, the silences are theirs).

`--gaps` runs each size's control plane a second time recording every rank's heartbeat
gaps, as it does for `chaos tune`'s measurement (harness.job.gaps, written every 2 s into a
scratch file), beside the one that does not: what the record costs the server.

`--tree DIR` (repeatable) runs each size's control plane from another checkout too, e.g.
the code before a change (`git worktree add /tmp/before HEAD~1`), beside this one's, with
the same stand-ins; its digests are read with its own `parse_digest` (the format changes).

On a real cluster the control plane has a node's cores to itself; here it shares two with
the stand-ins, so its figures are an upper bound on the time it needs.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import resource
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harness.job.control import LISTENING, heartbeat_port
from harness.job.detector import MAX_RANKS, TICK_S, floor_for, parse_digest
from harness.job.policies import DetectorSpec
from runfolder.heartbeats import HEARTBEAT_GAPS_FILE, read_heartbeat_gaps

READERS = 8
OnDigest = Callable[[int, bytes, float], None]  # (the reader's rank, the digest, when it came)
SETTLE_S = 2.0  # after every rank was heard, before measuring: phi needs a few intervals
START_S = 60.0  # the control plane's start (it imports torch)
# The control plane's process; it dies with the bench (PR_SET_PDEATHSIG), even one SIGKILLed.
SERVER = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
          "os.getppid() == int(sys.argv[2]) or sys.exit(0); "
          "from harness.job.control import main; "
          "sys.exit(main({'port': int(sys.argv[1]), 'host': '127.0.0.1', "
          "**({'gaps': sys.argv[3]} if len(sys.argv) > 3 else {})}))")


@dataclass(frozen=True)
class Figures:
    ranks: int
    seconds: float
    server_cpu_s: float
    digest_bytes: float          # mean size of the digests read
    gaps: list[float]            # between digests, at the readers
    silences: list[float]        # per digest read, the longest silence it reported
    sent: int                    # heartbeats the stand-ins sent while measuring
    due: int                     # heartbeats due in that time
    late_s: float                # the stand-ins' latest send against its schedule
    dropped: int                 # heartbeats the server's socket dropped (its buffer was full)


def free_port() -> int:
    """A port whose next one is free too (the heartbeat server's)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with socket.socket() as other:
            try:
                other.bind(("127.0.0.1", heartbeat_port(port)))
                return port
            except OSError:
                continue


def start_server(port: int, tree: Path | None, gaps: Path | None = None) -> tuple[subprocess.Popen, list[str]]:
    """The control plane (this checkout's, or `tree`'s; recording heartbeat gaps into `gaps`
    if given), listening; and what it said before (that it runs at nice 0)."""
    # -P: the installed harness (or PYTHONPATH's), never one in the working directory
    env = os.environ if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    server = subprocess.Popen([sys.executable, "-P", "-c", SERVER, str(port), str(os.getpid()),
                               *([str(gaps)] if gaps else [])],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert server.stdout is not None
    said: list[str] = []
    deadline = time.monotonic() + START_S
    while select.select([server.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
        line = server.stdout.readline()
        if LISTENING in line:
            return server, said
        if not line:
            break
        said.append(line.strip())
    server.kill()
    server.wait()
    raise RuntimeError(f"the control plane did not start within {START_S:g} s: "
                       + ("; ".join(said) or "no output"))


def udp_drops(pid: int, port: int) -> int:
    """Datagrams the kernel dropped for process `pid`'s UDP socket on `port` (/proc/net/udp)."""
    drops = 0
    for line in Path(f"/proc/{pid}/net/udp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port:
            drops += int(fields[-1])
    return drops


def cpu_seconds(pid: int | str = "self") -> float:
    """Process `pid`'s CPU time (user + system), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class StandIns:
    """N ranks' heartbeat sockets and leases, in this process."""

    def __init__(self, ranks: int, address: tuple[str, int], interval_s: float, floor_s: float) -> None:
        self.interval_s = interval_s
        self.udp: list[socket.socket] = []
        self.leases: list[socket.socket] = []
        self.readers = tuple(range(0, ranks, max(1, ranks // READERS)))
        for rank in range(ranks):
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            if rank not in self.readers:
                udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's minimum
            udp.connect(address)
            udp.setblocking(False)
            self.udp.append(udp)
            lease = socket.create_connection(address, timeout=10)
            lease.sendall(f"{rank} {floor_s!r}\n".encode())
            self.leases.append(lease)
        self.seq = [0] * ranks

    def close(self) -> None:
        for s in self.udp + self.leases:
            s.close()

    def beat(self, rank: int) -> None:
        self.seq[rank] += 1
        try:
            self.udp[rank].send(f"hb {rank} {self.seq[rank]} 0".encode())
        except OSError:
            pass

    def read(self, on_digest: OnDigest) -> None:
        for rank in self.readers:
            while True:
                try:
                    data = self.udp[rank].recv(65536)
                except (BlockingIOError, InterruptedError):
                    break
                on_digest(rank, data, time.monotonic())

    def run(self, seconds: float, on_digest: OnDigest) -> tuple[int, int, float]:
        """Beat every rank on schedule for `seconds`, reading the readers' digests between
        sends. Returns (sent, due, the latest send against its schedule)."""
        ranks = len(self.udp)
        spacing = self.interval_s / ranks
        start = time.monotonic()
        end = start + seconds
        sent = 0
        late = 0.0
        while (now := time.monotonic()) < end:
            while start + sent * spacing <= now:
                late = max(late, now - (start + sent * spacing))
                self.beat(sent % ranks)
                sent += 1
            self.read(on_digest)
            time.sleep(max(0.0, start + sent * spacing - time.monotonic()))
        return sent, int(seconds / spacing), late


def digest_reader(tree: Path | None) -> Callable[[bytes, float], Any]:
    """`parse_digest` of this checkout or of `tree` (the module needs only the standard library)."""
    if tree is None:
        return parse_digest
    spec = importlib.util.spec_from_file_location(f"detector_of_{abs(hash(tree))}", tree / "harness" / "job" / "detector.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.parse_digest


def measure(ranks: int, seconds: float, detector: DetectorSpec, tree: Path | None, gaps: Path | None = None
            ) -> Figures:
    port = free_port()
    server, said = start_server(port, tree, gaps)
    parse = digest_reader(tree)
    for line in said:
        print(f"({ranks} ranks) {line}", file=sys.stderr)
    stand_ins = None
    try:
        stand_ins = StandIns(ranks, ("127.0.0.1", heartbeat_port(port)), detector.interval,
                             floor_for(detector.suspect_after))
        heard_all: list[bool] = [False]

        def until_heard(rank: int, data: bytes, at: float) -> None:
            view = parse(data, at)
            heard_all[0] = heard_all[0] or len(view.ranks()) == ranks

        deadline = time.monotonic() + START_S
        while not heard_all[0]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the control plane did not hear all {ranks} ranks within {START_S:g} s")
            stand_ins.run(0.1, until_heard)
        stand_ins.run(SETTLE_S, lambda *_: None)

        last: dict[int, float] = {}
        gaps: list[float] = []
        silences: list[float] = []
        sizes: list[int] = []

        def record(rank: int, data: bytes, at: float) -> None:
            view = parse(data, at)
            sizes.append(len(data))
            if rank in last:
                gaps.append(at - last[rank])
            last[rank] = at
            silences.append(max(view.silent_s))

        hb_port = heartbeat_port(port)
        cpu_before, drops_before = cpu_seconds(server.pid), udp_drops(server.pid, hb_port)
        started = time.monotonic()
        sent, due, late = stand_ins.run(seconds, record)
        elapsed = time.monotonic() - started
        cpu = cpu_seconds(server.pid) - cpu_before
        dropped = udp_drops(server.pid, hb_port) - drops_before
        mean_size = statistics.fmean(sizes) if sizes else 0.0
        return Figures(ranks, elapsed, cpu, mean_size, gaps, silences, sent, due, late, dropped)
    finally:
        if stand_ins is not None:
            stand_ins.close()
        server.kill()
        server.wait()


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def silence(seconds: float, floor_s: float) -> str:
    """A digest tells no silence under the ranks' floor (it reads 0: the rank is fresh)."""
    return f"{seconds * 1000:.0f} ms" if seconds > 0 else f"under {floor_s * 1000:.0f} ms"


def row(f: Figures, suspect_after: float) -> str:
    floor_s = floor_for(suspect_after)
    if not f.gaps or not f.silences:
        return f"no digest reached a reader in {f.seconds:.0f} s | | | | | | |"
    bytes_per_s = f.digest_bytes * f.ranks / TICK_S
    worst = max(f.silences)
    verdict = "none" if worst < suspect_after else f"**yes: {worst:.2f} s >= {suspect_after:g} s**"
    return (f"{f.server_cpu_s / f.seconds:.0%} | {f.digest_bytes:,.0f} B, {bytes_per_s / 1e6:.1f} MB/s "
            f"| {statistics.median(f.gaps) * 1000:.0f} / {quantile(f.gaps, 0.99) * 1000:.0f} / {max(f.gaps) * 1000:.0f} ms "
            f"| {silence(quantile(f.silences, 0.99), floor_s)} / {silence(worst, floor_s)} | {verdict} "
            f"| {f.sent / f.due:.0%}, latest {f.late_s * 1000:.0f} ms | {f.dropped:,} ({f.dropped / f.sent:.1%}) |")


def main(argv: list[str] | None = None) -> int:
    defaults = DetectorSpec()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured per size (default 10)")
    parser.add_argument("--gaps", action="store_true",
                        help="also run this checkout's control plane recording heartbeat gaps (chaos tune's)")
    parser.add_argument("--tree", type=Path, action="append", default=[], metavar="DIR",
                        help="also run the control plane from this checkout (repeatable)")
    args = parser.parse_args(argv)
    if any(n < 1 or n > MAX_RANKS for n in args.ranks) or args.seconds <= 0:
        parser.error(f"--ranks takes 1-{MAX_RANKS} (one digest is one datagram), --seconds a positive number")
    for tree in args.tree:
        if not (tree / "harness" / "job" / "control.py").is_file():
            parser.error(f"--tree {tree}: not a checkout of this project (no harness/job/control.py)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * max(args.ranks) + 64  # a socket and a lease per rank, here and in the server
    if needed > hard:
        print(f"control_plane: {max(args.ranks)} ranks need {needed} open files, the limit is {hard} "
              "(ulimit -Hn); run fewer --ranks")
        return 2
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
    interval = defaults.interval
    print(f"heartbeat every {interval:g} s per rank, a digest every {TICK_S:g} s to every rank, "
          f"{args.seconds:g} s per size, {len(os.sched_getaffinity(0))} cores\n")
    print("| ranks | control plane | server CPU (one core) | digest, sent per second | gap between digests: median / p99 / max "
          "| longest silence a digest reported for a beating rank: p99 / max | false alarm at suspect_after "
          f"{defaults.suspect_after:g} s | heartbeats sent on time | heartbeats the server's socket dropped |")
    print("|---|---|---|---|---|---|---|---|---|")
    # (label, checkout, records gaps)
    sides: list[tuple[str, Path | None, bool]] = [("this checkout", None, False),
                                                  *([("this checkout, recording gaps", None, True)] if args.gaps else []),
                                                  *((str(t.resolve()), t.resolve(), False) for t in args.tree)]
    # only with --gaps: a bench killed before its end leaves no folder it did not need
    with tempfile.TemporaryDirectory(prefix="control-plane-gaps-") if args.gaps else contextlib.nullcontext() as scratch:
        for ranks in args.ranks:
            for label, tree, gaps in sides:
                record = Path(scratch) / str(ranks) if gaps else None
                try:
                    if record is not None:
                        record.mkdir()
                    cells = row(measure(ranks, args.seconds, defaults, tree, record and record / HEARTBEAT_GAPS_FILE),
                                defaults.suspect_after)
                except (RuntimeError, OSError) as exc:
                    cells = f"failed: {exc} | | | | | | |"
                if record is not None:  # what it wrote by its last write (it is killed, as at a trial's end)
                    recorded = read_heartbeat_gaps(record)
                    label += f" ({recorded.gaps if recorded else 0:,} gaps on file)"
                print(f"| {ranks} | {label} | {cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
