"""The GPU faults on CPU: gpu_hang as a value and a scenario field (refused where no rank code
or no GPU can play it), its command file (ledger first, undone by revert and by heal), the
rank's watcher with a fake kernel and a fake clock, the cycle count from a measured rate;
the kill's GPU memory figure from NVML's answers given as values; one GPU per container.
On a GPU (requires_gpu): the kernel really spins for its time on the training's stream."""
from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from chaos.api import Host
from chaos.cmdfile import CommandFile, command_path
from chaos.errors import InvalidFault, UnsupportedFault
from chaos.faults import GpuHang, parse_fault
from chaos.heal import heal
from chaos.ledger import Ledger
from chaos.undo import UNDOS
from harness.cluster.docker.template import RankTemplate
from harness.job.device import choose
from harness.job.gpufault import (CALIBRATION_CYCLES, HangWatcher, command_file, commands_dir, cycles_per_second,
                                  spin_kernel)
from harness.scenario.scenario import load_scenario
from harness.trial.gpumem import GpuRelease
from harness.trial.plan import placement_problem
from reports.metrics import _gpu_freed_columns
from reports.tables import what_happened

HOST = Host(name="r005", address="10.77.0.15", switch_ns="chaos-x-sw", port="p5", ns_path="/run/netns/chaos-x-r005")


# -- the fault value and the scenario -------------------------------------------------------

def test_a_gpu_hang_needs_a_finite_duration_above_zero() -> None:
    assert parse_fault({"kind": "gpu_hang", "duration": "1.5s"}) == GpuHang(duration=1.5)
    for given, says in (({}, "gpu_hang.duration: Field required"),
                        ({"duration": "0s"}, "greater than 0"),
                        ({"duration": float("inf")}, "inf is not a finite time")):
        with pytest.raises(InvalidFault, match=says):
            parse_fault({"kind": "gpu_hang", **given})


def scenario_file(tmp_path: Path, fault: str, extra: str = "") -> Path:
    path = tmp_path / "gh.yaml"
    path.write_text(f"name: gh\ncluster: {{ranks: 4}}\n{extra}faults:\n  - {fault}\n")
    return path


def test_the_scenario_s_duration_is_the_kernel_s_length(tmp_path: Path) -> None:
    scenario = load_scenario(scenario_file(tmp_path, "{kind: gpu_hang, target: {rank: 1}, start: 2s, duration: 7s}"))
    assert scenario.faults[0].fault == GpuHang(duration=7.0) and scenario.faults[0].duration == 7.0


@pytest.mark.parametrize(("fault", "extra", "says"), [
    ("{kind: gpu_hang, target: {rank: 1}, start: 2s}", "",
     "gh.yaml:4: faults.0.duration: missing; this kind spins for a set time"),
    ("{kind: gpu_hang, target: {rank: 1}, duration: 4s, pulses: {on_for: 1s, off_for: 1s}}", "",
     "gh.yaml:4: faults.0.pulses: a gpu_hang is one kernel that cannot be stopped once queued"),
    ("{kind: gpu_hang, target: {rank: 1}, duration: 4s}", "job: {command: [python, train.py]}\n",
     "gh.yaml:5: faults.0.kind: 'gpu_hang' is queued by the harness's rank code, and a user's job"),
])
def test_what_cannot_be_played_is_refused_with_file_line_field_and_fix(
        tmp_path: Path, fault: str, extra: str, says: str) -> None:
    with pytest.raises(Exception, match=says.replace("(", r"\(").replace(".", r"\.")):
        load_scenario(scenario_file(tmp_path, fault, extra))


@pytest.mark.parametrize(("device", "gpus"), [("cpu", 8), ("auto", 0)])
def test_a_gpu_hang_on_ranks_placed_on_the_cpu_is_refused_at_plan_time(tmp_path: Path, device: str, gpus: int) -> None:
    path = scenario_file(tmp_path, "{kind: gpu_hang, target: {rank: 1}, duration: 4s}")
    placement = choose(device, "auto", 4, gpus)
    problem = placement_problem(load_scenario(path), path, placement.device, placement.reason)
    assert problem == (f"{path}:4: faults.0.kind: 'gpu_hang' spins a kernel on the rank's GPU, but this run "
                       f"places its ranks on the CPU ({placement.reason}); run it on a host with an NVIDIA "
                       "GPU (cluster.device: cuda or auto), or use kind: pause for a silent stall on the CPU")
    cuda = choose("auto", "auto", 4, 1)
    assert placement_problem(load_scenario(path), path, cuda.device, cuda.reason) is None


# -- the command file -----------------------------------------------------------------------

def test_the_command_is_in_the_ledger_before_it_is_written_and_its_undo_removes_it(tmp_path: Path) -> None:
    ledger = Ledger("gh0001", tmp_path / "state")
    seen_before_write = []

    def clock() -> float:  # read while the file is written: the ledger already names it
        seen_before_write.append([e.op for e in ledger.entries()])
        return 100.0
    directory = commands_dir(tmp_path / "trial")
    [entry] = CommandFile(directory, clock).apply(GpuHang(duration=3.0), HOST, ledger)
    path = command_path(directory, "r005", "gpu_hang")
    assert seen_before_write == [["remove_file"]] and entry.args == {"path": str(path)}
    assert json.loads(path.read_text()) == {"id": f"gh0001.{entry.id}", "until": 103.0}
    assert path == command_file(tmp_path / "trial", 5)  # where the rank looks
    UNDOS.revert(entry, ledger)
    assert not path.exists()
    UNDOS.revert(entry, ledger)  # already gone: fine


def test_heal_after_the_harness_died_removes_the_command(tmp_path: Path) -> None:
    state = tmp_path / "state"
    CommandFile(tmp_path / "commands").apply(GpuHang(duration=3.0), HOST, Ledger("gh0002", state))
    report = heal(UNDOS, run_id="gh0002", directory=state)
    assert not report.failed and not list((tmp_path / "commands").iterdir())


def test_without_a_trial_folder_the_command_is_refused() -> None:
    with pytest.raises(UnsupportedFault, match="delivered through a trial's run folder"):
        CommandFile(None).apply(GpuHang(duration=1.0), HOST, Ledger("gh0003", Path("/nonexistent")))


@pytest.mark.parametrize("backend", ["local", "netns"])
def test_a_trial_delivers_gpu_hang_into_its_own_folder_on_every_backend(tmp_path: Path, backend: str) -> None:
    # the local cluster's process mechanisms include a gpu_hang without a folder: the
    # trial's own must win (on the first GPU run the local backend's gpu_hang was refused)
    from harness.cluster.backends import backend_class
    from harness.cluster.local import LocalCluster
    from harness.trial.orchestrator import trial_mechanisms

    class Cluster:
        mechanisms = LocalCluster.mechanisms if backend == "local" else lambda self: {}
    chosen = trial_mechanisms(backend_class(backend), Cluster(), tmp_path / "trial")
    chosen["gpu_hang"].apply(GpuHang(duration=2.0), HOST, Ledger("gh0004", tmp_path / "state"))
    assert command_path(commands_dir(tmp_path / "trial"), HOST.name, "gpu_hang").exists()


# -- the rank's watcher -----------------------------------------------------------------------

def write_command(path: Path, id: str, until: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"id": id, "until": until}))


def test_each_command_is_played_once_for_what_is_left_of_it(tmp_path: Path) -> None:
    now = [50.0]
    spins: list[float] = []
    path = command_file(tmp_path, 2)
    watcher = HangWatcher(path, spins.append, clock=lambda: now[0])
    assert watcher.poll() is None  # no command yet
    write_command(path, "run.7", until=60.0)
    now[0] = 50.25  # read a quarter second late: spins until the fault's end, not past it
    assert watcher.poll().seconds == pytest.approx(9.75)  # type: ignore[union-attr]
    assert watcher.poll() is None and spins == [pytest.approx(9.75)]  # once per command
    write_command(path, "run.9", until=70.0)  # the next apply
    now[0] = 65.0
    assert watcher.poll() is not None and spins[-1] == pytest.approx(5.0)
    write_command(path, "run.11", until=80.0)
    now[0] = 80.5  # read after its end (the rank was busy elsewhere): nothing to play
    assert watcher.poll() is None and len(spins) == 2


def test_the_watcher_thread_plays_a_command_written_while_it_runs(tmp_path: Path) -> None:
    path = command_file(tmp_path, 0)
    played = threading.Event()
    spins: list[float] = []

    def spin(seconds: float) -> None:
        spins.append(seconds)
        played.set()
    stop = threading.Event()
    thread = HangWatcher(path, spin).start(stop)
    try:
        write_command(path, "run.1", until=time.monotonic() + 5.0)
        assert played.wait(timeout=5.0)
        time.sleep(0.1)  # a few more polls of the same command
    finally:
        stop.set()
        thread.join(timeout=5.0)
    assert not thread.is_alive() and len(spins) == 1 and 4.0 < spins[0] <= 5.0


class FakeCuda:
    """torch.cuda as spin_kernel uses it: events time the calibration spin."""

    def __init__(self, calibration_ms: float | list[float]) -> None:
        # one timing for every calibration spin, or one each in turn
        self.timings = calibration_ms if isinstance(calibration_ms, list) else None
        self.calibration_ms = calibration_ms
        self.sleeps: list[tuple[object, int]] = []
        self.current: object = None

    class _Stream:
        def __init__(self, cuda: "FakeCuda", stream: object) -> None:
            self.cuda, self.stream = cuda, stream

        def __enter__(self) -> None:
            self.cuda.current = self.stream

        def __exit__(self, *exc: object) -> None:
            self.cuda.current = None

    def stream(self, stream: object) -> "FakeCuda._Stream":
        return FakeCuda._Stream(self, stream)

    def _sleep(self, cycles: int) -> None:
        self.sleeps.append((self.current, cycles))

    def Event(self, enable_timing: bool) -> "FakeCuda":  # noqa: N802 (torch's name)
        assert enable_timing
        return self

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: object) -> float:
        return self.timings.pop(0) if self.timings is not None else self.calibration_ms


def test_cycles_come_from_the_rate_measured_on_the_training_stream() -> None:
    cuda = FakeCuda(calibration_ms=CALIBRATION_CYCLES / 1.8e9 * 1e3)  # a GPU at 1.8 GHz under load
    spin = spin_kernel("training-stream", cuda)
    spin(2.5)
    assert cuda.sleeps == [("training-stream", CALIBRATION_CYCLES)] * 2 + [("training-stream", round(2.5 * 1.8e9))]


def test_the_rate_is_the_one_the_clock_reaches_under_load() -> None:
    # an idle GPU's clock rises while the first timings run (345 MHz idle, 1980 MHz under
    # load on the first GPU run): a rate from the first timing made a 1.0 s spin last 0.73 s
    cuda = FakeCuda(calibration_ms=[CALIBRATION_CYCLES / hz * 1e3 for hz in (0.4e9, 1.5e9, 1.98e9, 1.97e9)])
    assert cycles_per_second("s", cuda) == pytest.approx(1.98e9)
    assert len(cuda.sleeps) == 4  # stopped once two timings agreed


@pytest.mark.requires_gpu
def test_on_cuda_the_kernel_holds_the_training_stream_for_its_time() -> None:
    import torch
    stream = torch.cuda.current_stream()
    spin = spin_kernel(stream, torch.cuda)
    x = torch.ones(1024, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.monotonic()
    start.record()
    spin(1.0)
    (x * 2).sum().item()  # the training's next synchronisation waits behind it
    end.record()
    end.synchronize()
    assert 0.9 <= time.monotonic() - t0 <= 1.3 and 0.9 <= start.elapsed_time(end) / 1e3 <= 1.3


# -- GPU memory after a kill ------------------------------------------------------------------

def nvml(*answers: dict[int, int] | None):
    queue = list(answers)
    return lambda: queue.pop(0)


def test_a_killed_process_is_freed_once_nvml_no_longer_lists_it() -> None:
    release = GpuRelease(nvml({100: 2**30, 101: 5}, {101: 5}, {}))
    assert release.freed() == []  # nothing killed: NVML not asked
    release.killed({3: 100, 4: 101, 6: None}, 10.0)  # rank 6 had no process left to kill
    assert release.freed() == []
    assert release.freed() == [(3, 100, 10.0)]
    assert release.freed() == [(4, 101, 10.0)]
    assert release.freed() == []  # once per rank


def test_without_nvml_a_kill_s_memory_is_not_observed() -> None:
    release = GpuRelease(nvml(None))
    release.killed({3: 100}, 10.0)
    assert release.freed() == [] and release.freed() == []  # asked once


def test_the_report_takes_the_slowest_killed_rank_or_says_not_observed() -> None:
    freed = pd.DataFrame([{"kind": "gpu_memory_freed", "t": 10.0 + s, "killed_t": 10.0, "rank": r}
                          for r, s in enumerate((0.4, 1.25))] + [{"kind": "step", "t": 9.0, "rank": 0}])
    assert _gpu_freed_columns(freed) == {"gpu_freed_after_kill_s": 1.25}
    none = _gpu_freed_columns(freed[freed["kind"] == "step"])
    assert math.isnan(none["gpu_freed_after_kill_s"])
    row = {"fault": "kill", "fault_targets": "5", "outcome": "crashed", "outcome_reason": "r5 killed"}
    assert what_happened({**row, "gpu_freed_after_kill_s": 1.25}).startswith(
        "r5 kill (its GPU memory gone 1.25 s after the kill)")
    assert what_happened({**row, "gpu_freed_after_kill_s": math.nan}).startswith(
        "r5 kill (GPU memory freed: not observed)")


# -- one GPU per container --------------------------------------------------------------------

def test_a_harness_run_container_gets_only_its_rank_s_gpu() -> None:
    template = RankTemplate(image="chaos-harness:gpu",
                            gpu_requests=({"driver": "nvidia", "count": "all", "capabilities": ["gpu"]},))
    [request] = template.create_options(gpu=5)["device_requests"]
    assert request["DeviceIDs"] == ["5"] and request["Count"] == 0 and request["Driver"] == "nvidia"
    assert "device_requests" not in template.create_options(gpu=None)  # a rank on the CPU
    assert "device_requests" not in RankTemplate(image="x").create_options(gpu=5)  # no GPU in the template
