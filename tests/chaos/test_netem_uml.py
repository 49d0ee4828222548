"""The netem tests (test_netem.py) inside a kernel that has sch_netem: Debian's User-Mode
Linux (package user-mode-linux, Linux 6.1 with sch_netem, veth and bridge as modules), run
as a process of this host's with the host's filesystem as its root (hostfs) and
tests/chaos/uml_init.sh as its init. No KVM is needed; it has one CPU and its syscalls are
several times slower than the host's, which test_netem.py's pacing allows for.

One boot (a boot costs seconds) runs two pytest sessions one after the other: the netem
tests as they are, then the delay test with a netem encoding the kernel accepts but reads
wrongly. Each writes its pytest log, JUnit XML and exit code into this module's temporary
folder; here they are judged: every test of the first passed, none skipped (a module that
failed to load would otherwise turn them into skips), and the second failed on the delay
it measured. The kernel gets a deadline and runs in a session of its own: at the deadline,
or on any failure here, every process of it is killed."""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

UML = "linux.uml"
BOOT_DEADLINE_S = 240
pytestmark = [pytest.mark.requires_root, pytest.mark.requires_uml]


@dataclass
class Session:
    rc: int
    log: str
    junit: ET.Element


def run_in_uml(out: Path, sessions: dict[str, tuple[list[str], dict[str, str]]]) -> dict[str, Session]:
    """Boot User-Mode Linux and run in it, in turn, per name `pytest PYTEST_ARGS` with `ENV`
    added to the environment; per name its exit code, log and JUnit."""
    out.mkdir()
    exports = f"PYTHONPATH={shlex.quote(str(REPO))} PYTHONDONTWRITEBYTECODE=1"
    runs = [f"env {' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())} {shlex.quote(sys.executable)} -m pytest "
            f"-p no:cacheprovider -rA --junitxml={shlex.quote(str(out / name))}.xml {shlex.join(args)} "
            f"> {shlex.quote(str(out / name))}.log 2>&1; echo $? > {shlex.quote(str(out / name))}.rc"
            for name, (args, env) in sessions.items()]
    (out / "command").write_text(f"cd {shlex.quote(str(REPO))}\nexport {exports}\n" + "\n".join(runs) + "\n")
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
    found = {}
    for name in sessions:
        log = (out / f"{name}.log").read_text() if (out / f"{name}.log").exists() else "(no log)"
        assert (out / f"{name}.rc").exists(), (f"the UML run did not finish {name}:\n{log[-3000:]}\n"
                                               f"{(out / 'log').read_text()[-2000:]}\n{(out / 'console').read_text()[-2000:]}")
        found[name] = Session(int((out / f"{name}.rc").read_text()), log, ET.parse(out / f"{name}.xml").getroot())
    return found


@pytest.fixture(scope="module")
def uml_sessions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Session]:
    return run_in_uml(tmp_path_factory.mktemp("netem-uml") / "uml", {
        "as_is": (["tests/chaos/test_netem.py"], {}),
        "broken": (["tests/chaos/test_netem.py", "-k", "loss_and_delay"], {"CHAOS_TEST_NETEM_BREAK": "latency_us"}),
    })


def outcomes(junit: ET.Element) -> dict[str, str]:
    found = {}
    for case in junit.iter("testcase"):
        verdicts = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        found[case.get("name")] = verdicts[0] if verdicts else "passed"
    return found


def test_netem_tests_and_calibration_pass_in_a_kernel_with_netem(uml_sessions):
    run = uml_sessions["as_is"]
    assert run.rc == 0, run.log[-6000:]
    found = outcomes(run.junit)
    assert set(found.values()) == {"passed"} and len(found) == 8, (found, run.log[-3000:])


def test_a_netem_encoding_the_kernel_accepts_but_reads_wrongly_fails_them(uml_sessions):
    run = uml_sessions["broken"]
    assert run.rc == 1, run.log[-3000:]
    assert outcomes(run.junit) == {"test_netem_loss_and_delay_for_real": "failure"}, run.log[-3000:]
    failure = next(run.junit.iter("failure")).get("message")
    assert "Expected: 0.02 ± 0.001" in failure, failure  # the 20 ms delay measured as 20 us
