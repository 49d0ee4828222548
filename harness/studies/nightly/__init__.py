"""`chaos nightly`: a plan of scenarios x policies x repeats run into one night folder, then
the night's history rows, files and gate (the analysis is reports.nightly's).

A plan file (YAML, validated once into frozen values; errors name file:line: field):

    seed: 1              # base seed: repeat r of a scenario runs with seed_for(seed, name, r)
    repeat: 3            # repeats of every entry (`--repeat` overrides)
    backend: netns       # netns | docker | local (`--backend` overrides)
    device: cpu          # what the ranks train on
    runs:
      - scenario: ../scenarios/loss_20pct.yaml   # a file or a glob, relative to the plan file
        policies: [baseline, timeout, retry]     # its policies (a user's job: its variants); default all
        ranks: 4                                 # optional: the scenario's cluster.ranks
        repeat: 5                                # optional: this entry's repeats
    campaigns:           # optional: `chaos campaign` once a night, its ETTR per policy gated
      - scenario: ../scenarios/elastic_kill.yaml
        policies: [timeout, elastic]
        duration: 45s
        mtbf: 15s
        seed: 2                                  # the schedule's; default the scenario's
        gate: {elastic: {ettr_at_least: 0.85}, timeout: {ettr_of_reference_at_least: 0.8}}

One cell is one plan entry x repeat: one run folder with a trial per policy (or variant of
a user's job), the way `chaos run` makes it (and its stored command reproduces it); a
campaign cell is one campaign folder, the way `chaos campaign` makes it (plan.CampaignCell). The night folder, NIGHTS/<night>/:

    manifest.json   the plan's digest, the night's run metadata, each finished cell
                    (rewritten atomically after every cell); while it says unfinished, the
                    next invocation of the same plan resumes the night: it skips the finished
                    cells and removes the run folder an interruption left half made
    runs/           one run folder per finished cell
    junit.xml summary.md metrics.prom trends.html   reports.nightly.write_night_files

Its modules: plan (the plan file and its cells), folder (the night folder, its manifest and
resume), matrix (running the cells, the progress line, the night's files), metadata (the
machine), command (`chaos nightly`). The names other packages use are these:
"""
from __future__ import annotations

from harness.studies.nightly.command import add_nightly_arguments, nightly_command
from harness.studies.nightly.folder import MANIFEST, RUNS, Done, Manifest, open_night, read_manifest, write_manifest
from harness.studies.nightly.matrix import NightProgress, finish_night, run_cells
from harness.studies.nightly.plan import PLANS, QUICK_PLAN, CampaignCell, Cell, expand, load_night_plan, seed_for

__all__ = ["MANIFEST", "PLANS", "QUICK_PLAN", "RUNS", "CampaignCell", "Cell", "Done", "Manifest", "NightProgress", "add_nightly_arguments",
           "expand", "finish_night", "load_night_plan", "nightly_command", "open_night", "read_manifest", "run_cells",
           "seed_for", "write_manifest"]
