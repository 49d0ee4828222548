"""The machine's speed: measured for real (it takes a fraction of a second), kept, read back."""
from __future__ import annotations

import json
import os
import resource
import sys

import pytest

from chaos.errors import DeadlineExceeded
from harness.trial import machine


def _children() -> set[int]:
    """This process's live child processes (the echo process must not outlive a measurement)."""
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except FileNotFoundError:  # it ended meanwhile
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.add(int(entry))
    return found


def test_it_measures_this_machine_and_leaves_no_process_behind():
    before, cpus = _children(), os.sched_getaffinity(0)
    speed = machine.measure()
    assert speed.cpus == len(cpus) and os.sched_getaffinity(0) == cpus
    assert 1 < speed.loop_ns < 10_000 and 0.5 < speed.wake_us < 100_000 and 0.01 < speed.fault_us < 10_000
    assert _children() == before
    assert speed.describe().startswith(f"{speed.cpus} CPUs")


def test_a_pages_first_touch_is_one_minor_fault_per_4_kib_page():
    """Whatever the kernel's huge page setting: 2 MiB pages would fault 512 times less."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    assert machine.fault_us(mib=4, repeats=2) > 0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults >= 2 * (4 << 20) // machine.PAGE


def test_an_echo_process_that_never_answers_ends_the_measurement_by_its_deadline():
    silent = "import os, time\nos.read(0, 1)\ntime.sleep(60)\n"
    before, cpus = _children(), os.sched_getaffinity(0)
    with pytest.raises(DeadlineExceeded, match=rf"machine's speed: the echo process \({sys.executable}\) did not answer within 0.5 s"):
        machine.wake_us(rounds=3, echo_code=silent, deadline_s=0.5)
    assert _children() == before
    assert os.sched_getaffinity(0) == cpus  # the thread's CPUs back, after the failure too


def test_a_bench_folder_keeps_the_figures_and_says_when_it_has_none(tmp_path):
    assert machine.recorded_line(tmp_path) == ("machine: not recorded (no machine.json: written by a bench "
                                               "before it kept the machine's speed)")
    speed = machine.record(tmp_path)
    assert machine.recorded_line(tmp_path) == f"machine: {speed.describe()}"
    assert json.loads((tmp_path / machine.MACHINE_FILE).read_text())["loop_ns"] == speed.loop_ns
    (tmp_path / machine.MACHINE_FILE).write_text('{"not_measured": "not measured (the reason)"}')
    assert machine.recorded_line(tmp_path) == "machine: not measured (the reason)"
    (tmp_path / machine.MACHINE_FILE).write_text('{"cpus": 2}')
    assert machine.recorded_line(tmp_path).startswith(f"machine: {tmp_path / machine.MACHINE_FILE} unreadable (")


def test_steal_is_the_eighth_value_of_the_cpu_line_in_seconds(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  1958121 0 476092 6827146 10705 0 123528 415011 0 0\ncpu0 1 2 3\n")
    assert machine.steal_s(stat) == 415011 / os.sysconf("SC_CLK_TCK")
    stat.write_text("cpu  1 2 3 4 5 6 7\n")  # a kernel that counts no steal
    assert machine.steal_s(stat) is None
    assert machine.steal_s(tmp_path / "missing") is None
    assert machine.steal_s() is not None  # this machine's kernel counts it


def test_the_cpu_model_comes_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n")
    assert machine.cpu_model(cpuinfo) == "Intel(R) Xeon(R) Processor"
    cpuinfo.write_text("processor\t: 0\n")  # e.g. some ARM kernels
    assert machine.cpu_model(cpuinfo) == ""
    assert machine.cpu_model(tmp_path / "missing") == ""
