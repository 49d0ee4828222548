"""The arguments and entry points of `chaos export k8s` and `chaos collect k8s`.

    chaos export k8s SCENARIO.yaml --policy NAME [--image IMAGE] [--namespace NS] [--out DIR]
                     [--api trainjob|pytorchjob] [--name NAME] [--checkpoint-claim PVC]
                     [--gpus-per-rank N]
    chaos collect k8s --namespace NS --job NAME --out RUN_DIR [--timeout DURATION]

Both raise UsageError for bad input (exit 2 through `chaos`'s main) and HarnessError when
the cluster cannot be read or the trial did not go as exported (exit 1).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from chaos import units
from harness.k8s.export import DEFAULT_IMAGE, export_trial, write_export
from harness.k8s.operators import OPERATORS


def _duration(text: str) -> float:
    try:
        return units.parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", type=Path, help="scenario YAML file")
    parser.add_argument("--policy", required=True, help="the policy of the trial (one of the scenario's)")
    parser.add_argument("--image", default=DEFAULT_IMAGE,
                        help=f"the rank image built from the Dockerfile (default: {DEFAULT_IMAGE})")
    parser.add_argument("--namespace", default="default", help="namespace of the job and its faults")
    parser.add_argument("--out", type=Path, help="folder for job.yaml and faults.yaml (default: k8s-<job>)")
    parser.add_argument("--api", choices=sorted(OPERATORS), default="trainjob",
                        help="Kubeflow Trainer TrainJob (default) or the training operator v1's PyTorchJob")
    parser.add_argument("--name", help="the job's name (default: <scenario>-<policy>)")
    parser.add_argument("--checkpoint-claim", metavar="PVC",
                        help="a ReadWriteMany PersistentVolumeClaim for the ranks' checkpoints, to keep "
                             "them beyond the pods (a restore does not need it)")
    parser.add_argument("--gpus-per-rank", type=int, default=0, metavar="N",
                        help="nvidia.com/gpu per rank pod (default 0: CPU)")


def export_main(args: argparse.Namespace) -> int:
    export = export_trial(args.scenario, args.policy, args.image, args.namespace, args.api, args.name,
                          args.checkpoint_claim, args.gpus_per_rank)
    written = write_export(export, args.out or Path(f"k8s-{export.job}"))
    print("wrote " + ", ".join(map(str, written)))
    for note in export.approximated:
        print(f"approximated: {note}")
    print(f"next: kubectl apply -f {written[0]}; chaos collect k8s --namespace {export.namespace} "
          f"--job {export.job} --out RUN_DIR" + (" (it says when to apply faults.yaml)" if export.workflow else ""))
    return 0


def add_collect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", default="default", help="namespace of the job")
    parser.add_argument("--job", required=True, help="the job's name (as `chaos export k8s` printed it)")
    parser.add_argument("--out", type=Path, required=True, help="the run folder to write (new or empty)")
    parser.add_argument("--timeout", type=_duration, default=3600.0, metavar="DURATION",
                        help="give up following the trial after this long (default 1h)")


def collect_main(args: argparse.Namespace) -> int:
    from harness.k8s.collect import collect
    from harness.k8s.kube import Kubernetes

    command = shlex.join(["chaos", "collect", "k8s", "--namespace", args.namespace, "--job", args.job,
                          "--out", str(args.out)])
    collect(Kubernetes(args.namespace), args.job, args.namespace, args.out, args.timeout,
            lambda line: print(line, file=sys.stderr, flush=True), command)
    return 0
