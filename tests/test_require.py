"""CHAOS_REQUIRE (tests/conftest.py): a machine lacking a capability CI requires fails the
session at collection, naming it; a user's machine lacking it skips, saying why. Shown on
pytest sessions of their own, each with one capability taken for missing (CHAOS_TEST_HIDE):
a kernel mechanism a test is marked with, one a scenario's fault kind needs, User-Mode
Linux for the netem tests, and Compose for docker-compose.yml run for real."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.requires_root  # the capability probe needs root

HIDDEN = {  # a capability: a test that needs it
    "clsact_bpf": "tests/chaos/test_mechanisms.py::test_blackhole_keeps_the_link_up_and_drops_everything",
    "nfqueue_delay": "scenarios/delay_50ms.yaml::timeout",
    "uml_netem": "tests/chaos/test_netem_uml.py::test_netem_tests_and_calibration_pass_in_a_kernel_with_netem",
    "compose": "tests/docker/test_compose_up.py::test_compose_up_runs_sixteen_ranks_to_max_steps_and_down_leaves_nothing",
}


def pytest_session(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    # a session that collects nothing under tests/ (CI's always does) loads tests/conftest.py
    # only as a plugin; the probe's state (what it found, hidden ones included) stays in tmp_path
    plugin = [] if any(a.startswith("tests/") for a in args) else ["-p", "tests.conftest"]
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CHAOS_STATE_DIR": str(tmp_path / "state"), **env})


@pytest.mark.parametrize("capability", HIDDEN)
def test_ci_fails_at_collection_naming_a_required_capability_that_is_missing(tmp_path, capability):
    done = pytest_session(tmp_path, "--collect-only", "-q", HIDDEN[capability],
                          CHAOS_REQUIRE=f"root,{capability}", CHAOS_TEST_HIDE=capability)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert (f"CHAOS_REQUIRE requires capabilities this machine lacks, which these tests need:\n"
            f"  {capability}: {capability} is taken for missing here (CHAOS_TEST_HIDE)\n"
            f"    needed by {HIDDEN[capability]}\n") in done.stderr, done.stderr


def test_a_users_machine_skips_the_same_tests_saying_why(tmp_path):
    # a user's machine requires nothing (the session CI runs this in requires everything)
    done = pytest_session(tmp_path, "-rs", *HIDDEN.values(), CHAOS_TEST_HIDE=",".join(HIDDEN), CHAOS_REQUIRE="")
    assert done.returncode == 0 and f"{len(HIDDEN)} skipped" in done.stdout, done.stdout + done.stderr
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    for capability in HIDDEN:
        assert any(f"{capability} is taken for missing here" in line for line in skipped), skipped


def test_an_unknown_capability_is_refused_with_the_known_ones(tmp_path):
    done = pytest_session(tmp_path, "--collect-only", "-q", "tests/test_require.py", CHAOS_REQUIRE="root,clsact")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert "CHAOS_REQUIRE names unknown capabilities clsact; known: root, gpu, uml_netem, docker" in done.stderr
