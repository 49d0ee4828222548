"""The harness process: scenario loading and schema, the trial plan, the orchestrator
that executes it, and the check that judges it. The top layer: may import
`harness.cluster` and `harness.job`."""
