"""Slurm's own command line, the backend's one interface to a cluster: sbatch, srun,
squeue, scontrol, scancel, sinfo (their output formats are Slurm's stable interface from
release to release, unlike pyslurm, which is tied to one release). Every call has a
deadline; a missing command, a controller that does not answer and a refusal become a
`SlurmError` naming the command, what Slurm said and the fix."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Sequence

from chaos import proc
from chaos.errors import HarnessError, UsageError
from chaos.reach import why_unreadable

COMMAND_TIMEOUT_S = 30.0
INSTALL = "install Slurm's client commands (Debian: apt-get install slurm-client)"


class SlurmError(HarnessError):
    """A Slurm command failed or did not answer."""


def conf_path() -> str | None:
    """The slurm.conf the commands of this process use (None: Slurm's default)."""
    return os.environ.get("SLURM_CONF")


def conf_note() -> str:
    conf = conf_path()
    return f"SLURM_CONF={conf}" if conf else "the default slurm.conf (SLURM_CONF is not set)"


def run(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S, check: bool = True,
        conf: str | None = None, dies_with_caller: bool = False) -> str:
    """Run a Slurm command; its standard output. With `check`, a non-zero exit raises.
    `conf`: the slurm.conf to use (a heal's: the one the run used), else the environment's.
    `dies_with_caller`: SIGKILLed when the harness is (a submission must not outlive it)."""
    if shutil.which(argv[0]) is None:
        raise SlurmError(f"`{argv[0]}` is not on PATH: {INSTALL}, or run from a login node of the cluster")
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, env={**os.environ, "SLURM_CONF": conf} if conf else None,
                              preexec_fn=proc.die_with_parent if dies_with_caller else None)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(argv)}` did not answer within {timeout_s:.0f} s: is the controller "
                         f"up ({conf_note()})? `chaos slurm up --nodes 4` runs a local cluster and prints the "
                         "SLURM_CONF to export; or point SLURM_CONF at your cluster's") from None
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmError(f"`{' '.join(argv)}` failed (exit {done.returncode}): "
                         f"{said[-1] if said else 'no output'} ({conf_note()})")
    return done.stdout


PING_TIMEOUT_S = 10.0


def ping() -> None:
    """The controller answers, or an error says how to get one: a SLURM_CONF this user
    cannot read is the user's to fix (UsageError), a controller that does not answer a SlurmError."""
    conf = os.environ.get("SLURM_CONF")
    if conf and (why := why_unreadable(conf)):
        raise UsageError(f"SLURM_CONF={conf}: {why}; export the path `chaos slurm up` printed (its cluster is "
                         "open to every user: docs/slurm.md), or your cluster's slurm.conf (or unset it to use "
                         "the default)")
    out = run(["scontrol", "ping"], timeout_s=PING_TIMEOUT_S, check=False)
    if "is UP" not in out:
        raise SlurmError(f"no Slurm controller answers ({conf_note()}; `scontrol ping`: "
                         f"{out.strip() or 'no answer'}): start one (`chaos slurm up --nodes 4` runs a local "
                         "cluster and prints the SLURM_CONF to export) or point SLURM_CONF at your cluster's")


def hostnames(nodelist: str) -> list[str]:
    """A compressed node list (node[01-04]) expanded by Slurm itself."""
    return run(["scontrol", "show", "hostnames", nodelist]).split()


def node_info(node: str, conf: str | None = None) -> dict[str, str]:
    """`scontrol show node` as key=value pairs (NodeAddr, State, Reason, ...)."""
    out = run(["scontrol", "show", "node", "-o", node], conf=conf)
    fields = {}
    for token in out.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def partitions() -> list[str]:
    return [p.rstrip("*") for p in run(["sinfo", "-h", "-o", "%P"]).split()]


def job_state(job_id: str) -> tuple[str, str, str]:
    """(state, reason, node list) of a job; ("", "", "") once Slurm has forgotten it."""
    out = run(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N"], check=False).strip()
    if not out:
        return "", "", ""
    state, reason, nodes = (out.splitlines()[0].split("|") + ["", ""])[:3]
    return state, reason, nodes


def restart_count(job_id: str) -> int:
    """How often Slurm started the job again (its SLURM_RESTART_COUNT); 0 once forgotten."""
    out = run(["scontrol", "show", "job", "-o", job_id], check=False)
    for token in out.split():
        if token.startswith("Restarts="):
            return int(token.split("=", 1)[1])
    return 0


def config_seconds(key: str, default: float) -> float:
    """A time of the cluster's configuration (`scontrol show config`: KillWait = 5 sec)."""
    for line in run(["scontrol", "show", "config"]).splitlines():
        name, _, value = line.partition("=")
        if name.strip() == key:
            words = value.split()
            return float(words[0]) if words and words[0].replace(".", "", 1).isdigit() else default
    return default


def set_node_state(node: str, state: str, reason: str | None = None, conf: str | None = None) -> None:
    """scontrol update of a node's state (DOWN, DRAIN, RESUME); an operator's right: a user
    who may not is told so."""
    argv = ["scontrol", "update", f"nodename={node}", f"state={state}"]
    if reason:
        argv.append(f"reason={reason}")
    try:
        run(argv, conf=conf)
    except SlurmError as exc:
        if "Access/permission denied" in str(exc) or "Invalid user" in str(exc):
            raise SlurmError(f"setting {node} {state} needs a Slurm operator (root or SlurmUser): {exc}") from None
        raise


# Slurm's KillWait between SIGTERM and SIGKILL, the epilog, and a node that could not be
# reached when the job was cancelled (its link down): Slurm resends the request once the
# node answers its ping again, 109 s later on the local cluster
CANCEL_TIMEOUT_S = 180.0


def cancel_named(name: str, conf: str | None = None, timeout_s: float = CANCEL_TIMEOUT_S) -> list[str]:
    """scancel every job of this user named `name` and wait until squeue no longer lists
    them; the job ids that were listed. A controller that cannot be asked raises: a job
    nobody could list is not a job known to be gone."""
    def listed() -> list[str]:
        return run(["squeue", "-h", "-n", name, "-o", "%i"], conf=conf).split()
    jobs = listed()
    if not jobs:
        return []
    run(["scancel", "--name", name], conf=conf, check=False)
    deadline = time.monotonic() + timeout_s
    while listed():
        if time.monotonic() > deadline:
            raise SlurmError(f"job(s) {', '.join(jobs)} ({name}) still listed by squeue {timeout_s:.0f} s "
                             "after scancel; see `scontrol show job`")
        time.sleep(0.2)
    return jobs
