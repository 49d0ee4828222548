"""`chaos tune`: the stages of a tune (stages), the runner that runs them as nightly cells
and reads their evidence (runner), the plan walked without running (planned: --dry-run and
the estimate) and the command (command); the rules are reports.tune's."""
