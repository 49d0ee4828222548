"""What runs inside a rank (or the control-plane process): its config, the fault-tolerant
runner (with its restore strategies, suspicion bookkeeping and exit reasons) and policies,
process groups, device and collective backend (device.py), the gpu_hang fault's watcher
(gpufault.py), failure detector, control plane, workload and checkpoints. Imports neither
`harness.cluster` nor the harness process (`harness.scenario`, `harness.trial`,
`harness.studies`): a rank knows nothing of how it was started or judged."""
