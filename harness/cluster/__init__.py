"""The launch edge: host backends (`backends`, the registry of their names: network
namespaces, containers, plain local processes), the rank launcher (zygote), the control
plane's start and the container entry point that start the job's processes on their hosts.
Runs in the harness process, except `zygote` and `container`, which are the parents of
rank processes; `fake` is a cluster without hosts, for root-free tests of the orchestrator;
`host` lists what runs left on this host (for the tests' session check and the kill bench).
Imports `harness.job` (what it launches), never the scenario model, the trial
engine or the studies (`harness.scenario`, `harness.trial`, `harness.studies`)."""
