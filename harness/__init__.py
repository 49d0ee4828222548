"""The cluster and the job: host backends, rank launcher, fault-tolerant runner and
policies, training workload, atomic checkpoint, event recorder, scenario loader,
orchestrator and the `chaos` command line."""
