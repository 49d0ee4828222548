"""Hostile or careless input is refused at load or at the command line, with the field,
the value and the fix: it never fails later, inside a run, or escapes onto the host."""
from __future__ import annotations

import pytest

from chaos.errors import InvalidFault, UsageError
from chaos.faults import parse_fault
from harness.job.policies import policy_spec
from tests.conftest import chaos_cli


@pytest.mark.parametrize("value", [float("inf"), float("nan"), "1e999s"])
def test_a_policy_time_must_be_finite(value):
    with pytest.raises(UsageError, match=r"policies\.timeout: timeout: .* not a finite time"):
        policy_spec("timeout", {"timeout": value})


def test_a_fault_time_must_be_finite():
    with pytest.raises(InvalidFault, match="delay.latency: inf is not a finite time"):
        parse_fault({"kind": "delay", "latency": float("inf")})


def test_the_same_policy_twice_is_a_usage_error():
    done = chaos_cli("run", "scenarios/kill_rank.yaml", "--policy", "timeout", "--policy", "timeout", "--dry-run")
    assert done.returncode == 2
    assert "--policy timeout given more than once" in done.stderr


def test_an_unwritable_out_is_a_usage_error_not_a_traceback(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = chaos_cli("run", "scenarios/kill_rank.yaml", "--policy", "timeout", "--out", str(blocker / "runs"))
    if done.returncode == 2 and "needs root" in done.stderr:
        pytest.skip("chaos run needs root")
    assert done.returncode == 2, done.stderr
    assert f"--out {blocker / 'runs'}: cannot write run folders there" in done.stderr
    assert "Traceback" not in done.stderr
