"""The netem tests (test_netem.py) inside a kernel that has sch_netem: Debian's User-Mode
Linux (package user-mode-linux, Linux 6.1 with sch_netem, veth and bridge as modules), run
as a process of this host's with the host's filesystem as its root (hostfs) and
tests/chaos/uml_init.sh as its init. No KVM is needed; it has one CPU and its syscalls are
several times slower than the host's, which test_netem.py's pacing allows for.

The run inside writes its pytest log, JUnit XML and exit code into this test's temporary
folder; here they are judged: every test passed, none skipped (a module that failed to load
would otherwise turn them into skips). The kernel gets a deadline and runs in a session of
its own: at the deadline, or on any failure here, every process of it is killed."""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import REPO

UML = "linux.uml"
BOOT_DEADLINE_S = 240
pytestmark = [pytest.mark.requires_root, pytest.mark.requires_uml]


def run_in_uml(out: Path, pytest_args: list[str], env: dict[str, str]) -> tuple[int, str, ET.Element]:
    """Boot User-Mode Linux, run `pytest PYTEST_ARGS` in it with `env`; (exit code, log, JUnit)."""
    out.mkdir()
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in {
        "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1", **env}.items())
    (out / "command").write_text(
        f"cd {shlex.quote(str(REPO))}\nexport {exports}\n"
        f"exec {shlex.quote(sys.executable)} -m pytest -p no:cacheprovider -rA "
        f"--junitxml={shlex.quote(str(out / 'junit.xml'))} {shlex.join(pytest_args)}\n")
    console = (out / "console").open("wb")
    kernel = subprocess.Popen(
        [shutil.which(UML) or UML, "mem=512M", "rootfstype=hostfs", "rw",
         f"init={REPO / 'tests' / 'chaos' / 'uml_init.sh'}", f"CHAOS_UML_OUT={out}",
         f"uml_dir={out / 'uml'}", "con=null", "con0=null,fd:1"],
        stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        kernel.wait(BOOT_DEADLINE_S)
    finally:
        console.close()
        if kernel.poll() is None:
            os.killpg(kernel.pid, signal.SIGKILL)
            kernel.wait()
    log = (out / "log").read_text() if (out / "log").exists() else "(no log)"
    assert (out / "rc").exists(), f"the UML run did not finish:\n{log[-3000:]}\n{(out / 'console').read_text()[-2000:]}"
    return int((out / "rc").read_text()), log, ET.parse(out / "junit.xml").getroot()


def outcomes(junit: ET.Element) -> dict[str, str]:
    found = {}
    for case in junit.iter("testcase"):
        verdicts = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        found[case.get("name")] = verdicts[0] if verdicts else "passed"
    return found


def test_netem_tests_and_calibration_pass_in_a_kernel_with_netem(tmp_path):
    rc, log, junit = run_in_uml(tmp_path / "uml", ["tests/chaos/test_netem.py"], {})
    assert rc == 0, log[-6000:]
    found = outcomes(junit)
    assert set(found.values()) == {"passed"} and len(found) == 8, (found, log[-3000:])


def test_a_netem_encoding_the_kernel_accepts_but_reads_wrongly_fails_them(tmp_path):
    rc, log, junit = run_in_uml(tmp_path / "uml", ["tests/chaos/test_netem.py", "-k", "loss_and_delay"],
                                {"CHAOS_TEST_NETEM_BREAK": "latency_us"})
    assert rc == 1, log[-3000:]
    assert outcomes(junit) == {"test_netem_loss_and_delay_for_real": "failure"}, log[-3000:]
    failure = next(junit.iter("failure")).get("message")
    assert "Expected: 0.02 ± 0.001" in failure, failure  # the 20 ms delay measured as 20 us
