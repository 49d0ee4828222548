"""The scenario model: a scenario file loaded and validated into frozen values (scenario),
its JSON schema for editors (schema), the anchor names a fault may start on (anchors), the
tiers (tiers), YAML errors named by file:line (yaml_errors) and the scaling rule (scaling).
The lowest harness-process layer: may import `harness.cluster` and `harness.job`, never the
trial engine (`harness.trial`) or a study (`harness.studies`)."""
