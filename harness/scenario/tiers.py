"""Where a scenario's trial runs: its tier, set by the scenario's `tier:` (one for every
trial, or trial -> tier; harness.scenario.scenario). The pytest plugin marks a trial with its
tier's name, one of the default tier excepted, and CI runs `-m "not nightly"`; why a trial
is not `ci` is a comment beside its `tier:` in the scenario file (docs/nightly.md). A leaf
module: the plugin registers the markers before it imports the harness."""
from __future__ import annotations

# each tier's name, with what it means
TIERS = {"ci": "run on every change (.ci/run), and by any night whose plan names it",
         "nightly": "run only by the nights (a night's plan, nightly/*.yaml); CI leaves it out"}
DEFAULT_TIER = "ci"
