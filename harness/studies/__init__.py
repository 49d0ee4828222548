"""The studies, one package each, each with its command (command.py: the CLI entry and its
arguments) beside its own modules: `chaos tune`, `chaos explore`, `chaos nightly`, `chaos
campaign` and `chaos init`. The top layer: may import the trial engine (`harness.trial`),
the scenario model (`harness.scenario`), `harness.cluster`, `harness.job` and `reports`."""
