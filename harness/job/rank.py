"""What one rank process runs: connect to the control plane, then train under a policy.

Entered in a child of the rank launcher, already inside the rank's network namespace,
with SIGTERM turned into `Terminated`. Exit codes: 0 stopped or terminated, 3 failed
fast, 4 retries exhausted, 5 isolated (breaker open), 70 crashed (uncaught error), 75
the harness's lease expired (`harness.job.lease`: a container whose harness is gone).
"""
from __future__ import annotations

import gc
import os
import random
import sys
import threading
from pathlib import Path
from typing import Any

from harness.job.config import RankConfig
from harness.job.outcome import EXIT_CODES, ExitReason


def main(config: dict[str, Any]) -> int:
    import torch

    from harness.job.control import heartbeat_port
    from harness.job.detector import FailureDetector, HeartbeatClient, floor_for, not_ahead
    from harness.job import flight
    from harness.job.gpufault import HangWatcher, command_file, spin_kernel
    from harness.job.stepdelay import StepDelays, step_delay_file
    from runfolder import events as kinds
    from runfolder.events import EventRecorder
    from harness.job.group import GlooGroup, gloo_environment
    from harness.job.planted import planted
    from harness import signals
    from harness.signals import Terminated
    from harness.job.workload import Workload

    cfg = RankConfig.model_validate(config)
    os.environ.update(gloo_environment(cfg.ifname, cfg.workload.gloo_lazy_init))
    os.environ.update(cfg.env)  # its GPU and NCCL settings (harness.job.device): before CUDA initialises
    torch.set_num_threads(1)
    # torch's ~10^6 objects are never garbage: frozen, a full collection takes ~0 s instead
    # of 0.2-0.9 s that would hold the GIL (and starve the thread that reads digests).
    gc.freeze()
    recorder = EventRecorder(cfg.events_path, "rank", cfg.rank)
    recording = flight.install(Path(cfg.events_path).parent, cfg.rank)  # before it says so
    recorder.emit(kinds.RANK_START, policy=cfg.policy.name, world=cfg.world_size, flight=recording)

    def leave(reason: ExitReason, **detail: Any) -> int:
        recorder.emit(kinds.EXIT, reason=reason.value, code=EXIT_CODES[reason], **detail)
        return EXIT_CODES[reason]

    try:
        group = GlooGroup((cfg.store_address, cfg.store_port), cfg.rank,
                          cfg.world_size, cfg.policy.timeout, cfg.policy.rendezvous_s,
                          on_wait=lambda gen, arrived: recorder.emit(
                              kinds.RENDEZVOUS, gen=gen, arrived=arrived, world=group.world_size),
                          on_reaped=lambda gen, secs: recorder.emit(
                              kinds.GROUP_REAPED, gen=gen, secs=round(secs, 3)), comm=cfg.comm,
                          store_timeout_s=cfg.store_timeout_s)
        detector = None
        if (spec := cfg.policy.detector) is not None:
            heartbeats = HeartbeatClient(
                (cfg.store_address, heartbeat_port(cfg.store_port)), cfg.rank, spec.interval,
                generation=lambda: group.generation, floor_s=floor_for(spec.suspect_after)).start()
            if warning := not_ahead(f"rank {cfg.rank}'s heart", heartbeats.nice):
                print(warning, file=sys.stderr, flush=True)
            detector = FailureDetector(heartbeats.view, cfg.rank, spec.suspect_after, spec.phi,
                                       spec.straggler_loss, stalled_since=heartbeats.stalls.since)
        workload = Workload(cfg.workload, cfg.seed, cfg.rank, torch.device(cfg.device))
        if cfg.device == "cuda":  # the gpu_hang fault's commands (harness.job.gpufault)
            stream = torch.cuda.current_stream(workload.device)  # the one the training queues on
            HangWatcher(command_file(Path(cfg.events_path).parent, cfg.rank),
                        spin_kernel(stream, torch.cuda)).start(threading.Event())
        runner_class, checkpointer_class = planted(cfg.policy.planted_defect)  # shipped ones unless planted
        runner = runner_class(
            cfg.policy, group, workload, checkpointer_class(cfg.checkpoint_dir), recorder,
            random.Random(cfg.seed * 1_000_003 + cfg.rank), detector=detector, sleep=signals.sleep,
            step_delay=StepDelays(step_delay_file(Path(cfg.events_path).parent, cfg.rank)).due)
        outcome = runner.run(cfg.max_steps)
    except Terminated:
        return leave(ExitReason.TERMINATED)
    except BaseException as exc:
        leave(ExitReason.CRASHED, error=str(exc)[:300])
        raise
    return leave(outcome)


# --- entry for a rank in its own container (the docker backend, `docker compose up`) ---

def wait_for_link(ifname: str, timeout_s: float) -> None:
    """Wait until `ifname` exists, is up with carrier and has an IPv4 address (the harness
    wires a container's eth0 only after the container started)."""
    import fcntl
    import socket
    import struct
    import time

    SIOCGIFFLAGS, SIOCGIFADDR, IFF_UP, IFF_RUNNING = 0x8913, 0x8915, 0x1, 0x40
    req = struct.pack("256s", ifname.encode()[:15])
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        while True:
            try:
                flags = struct.unpack_from("H", fcntl.ioctl(sock, SIOCGIFFLAGS, req), 16)[0]
                if flags & IFF_UP and flags & IFF_RUNNING:
                    fcntl.ioctl(sock, SIOCGIFADDR, req)  # raises until an address is set
                    return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{ifname} was not up with an address within {timeout_s:.0f}s")
            time.sleep(0.01)


def start_barrier(directory: str, rank: int, world_size: int, timeout_s: float) -> None:
    """Announce this rank loaded (``rNNN.ready`` in `directory`) and wait until all
    `world_size` ranks did, so that containers started one after another (each importing
    torch on its own) enter the rendezvous together, as the zygote's forks do."""
    import time

    ready = os.path.join(directory, f"r{rank:03d}.ready")
    with open(ready, "w"):
        pass
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r in range(world_size)
                   if not os.path.exists(os.path.join(directory, f"r{r:03d}.ready"))]
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"ranks {missing} not loaded within {timeout_s:.0f}s")
        time.sleep(0.02)


def cli(argv: list[str] | None = None) -> int:
    """``python -m harness.job.rank --config FILE``: run one rank as this process, return its code."""
    import argparse
    import json
    import traceback

    from harness import signals

    from harness.job import lease

    parser = argparse.ArgumentParser(prog="python -m harness.job.rank")
    parser.add_argument("--config", required=True, help="a RankConfig as a JSON file")
    parser.add_argument("--link-timeout", type=float, default=60.0,
                        help="seconds to wait for the config's ifname to come up (default 60)")
    parser.add_argument("--barrier", type=float, default=None, metavar="SECONDS",
                        help="load torch, then wait up to SECONDS until every rank has loaded "
                             "(rNNN.ready files beside the config)")
    parser.add_argument("--lease", default=None, metavar="FILE",
                        help="leave once FILE is not renewed for --lease-timeout seconds "
                             "(the harness is gone; harness.job.lease)")
    parser.add_argument("--lease-timeout", type=float, default=lease.TIMEOUT_S, metavar="SECONDS")
    args = parser.parse_args(argv)
    if args.lease is not None:  # first: a rank still loading torch must leave too
        lease.watch(Path(args.lease), args.lease_timeout)
    try:
        with open(args.config) as f:
            config = json.load(f)
        if args.barrier is not None:
            import torch  # noqa: F401  (the seconds-long part of a start, before the barrier)
            import torch.distributed  # noqa: F401
            from harness.job.config import WorkloadSpec
            from harness.job.workload import Workload
            Workload(WorkloadSpec(), seed=0, rank=0)  # first use of nn and autograd
        # Only now: a `Terminated` raised inside an import leaves half-initialised modules
        # (numpy then fails with ImportError). Until here SIGTERM keeps the caller's
        # disposition (default: die; `harness.cluster.container`: exit 0 at once).
        signals.install()
        wait_for_link(config.get("ifname", "eth0"), args.link_timeout)
        if args.barrier is not None:
            start_barrier(os.path.dirname(os.path.abspath(args.config)), config["rank"],
                          config["world_size"], args.barrier)
        return main(config)
    except signals.Terminated:
        return 0
    except BaseException:
        traceback.print_exc()
        return EXIT_CODES[ExitReason.CRASHED]


if __name__ == "__main__":
    import sys
    _code = cli()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_code)  # as the zygote's children do: no interpreter teardown (~2 s with torch)
