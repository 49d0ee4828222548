"""The trial engine: a scenario's trial plan (plan), the orchestrator that executes it (with
anchor_watch, faults started on events; traffic, the bytes through each faulted link; gpumem,
GPU memory released after a breaker opens or a kill; stacks, where each rank was stuck),
the progress line (progress), the machine's speed (machine), busy CPU processes (hogs) and
the check that runs and judges one policy (check, under `pytest scenarios/`). May import the
scenario model (`harness.scenario`), `harness.cluster`, `harness.job` and `reports`; never a
study (`harness.studies`)."""
