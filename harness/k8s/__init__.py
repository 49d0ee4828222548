"""Past one machine: a trial on a Kubernetes cluster, through Chaos Mesh and the Kubeflow trainer.

    harness.k8s.operators  the two job APIs (TrainJob, PyTorchJob): labels, names, selectors
    harness.k8s.env        a rank's CHAOS_* environment, checked against the trial's plan
    harness.k8s.jobs       the job manifests and the plan ConfigMap
    harness.k8s.faults     the fault timeline as a Chaos Mesh Workflow; what is refused
    harness.k8s.export     `chaos export k8s`: a scenario under one policy -> job.yaml, faults.yaml
    harness.k8s.kube       the edge to a cluster (the `kubernetes` client, imported lazily)
    harness.k8s.observe    pods, logs and chaos records -> the harness's events, in clock domains
    harness.k8s.collect    `chaos collect k8s`: follow a trial, write a normal run folder
    harness.k8s.cli        the two commands' arguments and entry points

It runs in the harness process; nothing of the job or the cluster backends imports it.
"""
