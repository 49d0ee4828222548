"""The harness process: scenario loading and schema, the trial plan, the orchestrator
that executes it (with traffic.py, the bytes through each faulted link, and gpumem.py,
GPU memory released after a breaker opens or a kill), the check that judges it, and `chaos nightly` (nightly.py: a plan of
repeated trials into one night folder, then reports.nightly's history, files and gate).
The top layer: may import `harness.cluster`, `harness.job` and `reports`."""
