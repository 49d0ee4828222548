"""`chaos campaign` for real, through the installed `chaos` command: a 4-rank job, a 15 s
window, faults from the llama3 mix; the fault-free reference and two policies (timeout ends
at its first fault and is started again as new jobs, elastic goes on), their ETTR rows, the
report and the picture, agreeing with the stored events."""
from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from reports.campaign import CAUSES, campaign_measures
from tests.conftest import CHAOS

SCENARIO = """\
name: campaign_ci
cluster: {ranks: 4}
workload: {step_period: 250ms, checkpoint_every: 8}
warmup_steps: 4
hang_cap: 20s  # above elastic's 10 s rendezvous timeout: its own recovery acts first
policies:
  timeout: {timeout: 3s}
  elastic: {}
"""


@pytest.mark.requires_root
def test_a_short_campaign_gives_ettr_per_policy_with_its_breakdown_and_the_picture(tmp_path: Path,
                                                                                    leaves_nothing) -> None:
    scenario = tmp_path / "campaign_ci.yaml"
    scenario.write_text(SCENARIO)
    done = subprocess.run([CHAOS, "campaign", str(scenario), "--duration", "15s", "--mtbf", "5s", "--seed", "2",
                           "--out", str(tmp_path / "runs")], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    [folder] = (tmp_path / "runs").glob("campaign_ci-campaign-*")
    campaign = json.loads((folder / "campaign.json").read_text())
    assert not campaign["partial"] and list(campaign["policies"]) == ["reference", "timeout", "elastic"]
    injected = [f for f in campaign["schedule"] if f["fault"]]
    assert injected and all(f["fault"]["kind"] == "kill" for f in injected)  # seed 2 draws kills here
    measured = campaign_measures(campaign)
    for policy, (m, _, _) in measured.items():
        assert 0 < m.ettr <= 1, policy
        assert math.isclose(m.kept_s + sum(m.lost_s[c] for c in CAUSES), m.wall_s, abs_tol=1e-6)
        assert f"| {policy} | {m.ettr:.1%} |" in (folder / "campaign.md").read_text()
        assert any(line.startswith(f"{policy} ") and f"{m.ettr:.1%}" in line for line in done.stdout.splitlines())
    # the timeout policy ends at its first fault: the campaign started it again as new jobs
    timeout, elastic = measured["timeout"][0], measured["elastic"][0]
    assert timeout.segments >= 2 and timeout.lost_s["restart"] > 0
    # elastic goes on smaller; where it hangs instead (a second kill 54 ms into its regroup
    # left it silent to a 10 s cap once), the report says so and counts the cap as lost
    report = (folder / "campaign.md").read_text()
    assert elastic.final_ranks < campaign["ranks"] or (
        elastic.hangs and elastic.lost_s["hang"] > 0 and "Hung (counted to the cap" in report and "elastic" in
        report.split("Hung (counted to the cap", 1)[1].splitlines()[0])
    assert measured["reference"][0].faults == [] and measured["reference"][0].goodput > timeout.goodput
    assert (folder / "kept-work.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
