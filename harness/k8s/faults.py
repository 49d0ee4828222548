"""A trial's fault timeline as one Chaos Mesh Workflow of NetworkChaos and PodChaos.

Each fault of the plan is one serial lane of the Workflow: a Suspend template waits until
the fault's next on-phase, a chaos template holds it for the on-phase (its deadline), and
so on; the lanes of several faults run in parallel. Chaos templates are named
"f<index>-on<phase>-p<part>" (a partition of k groups takes k - 1 NetworkChaos per
on-phase): Chaos Mesh names a workflow node "<template>-<5 characters>" and labels the
chaos object it makes with that node's name (chaos-mesh.org/controlled-by), so
`chaos collect k8s` maps every object back to its fault and on-phase.

Every choice made in the mapping is a note, written as a YAML comment above the Workflow
and marked exact or approximated. A fault with no equivalent in Chaos Mesh (pause, and the
variants listed in `map_fault`) is refused with the reason.
"""
from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Any

from chaos.errors import UsageError
from chaos.faults import (Bandwidth, Blackhole, Corrupt, Delay, Duplicate, FaultBase, FuseStorageFault, Kill, LinkDown,
                          LinkFault, Loss, Partition, Pause, Reorder, Slow, StepDelay,
                          StorageFault)
from chaos.tc import tbf_sizes
from chaos.topology import host_index, host_name
from harness.k8s.env import duration_text
from harness.k8s.operators import Pods
from harness.trial.plan import ranks_text
from runfolder.plan import APPLY, PlannedFault, TrialPlan

API_VERSION = "chaos-mesh.org/v1alpha1"
TEMPLATE = re.compile(r"^f(\d+)-on(\d+)-p(\d+)$")
# The kinds of chaos object a Workflow of this export creates, by template type.
CHAOS_PLURALS = {"NetworkChaos": "networkchaos", "PodChaos": "podchaos"}

# How each way of a link maps onto Chaos Mesh's direction, seen from the rank's pod.
_DIRECTIONS = {"both": "both", "from_host": "to", "to_host": "from"}
_SCOPE = ("scope: the traffic between the rank's pod and every pod of the job (the ranks and the "
          "control plane), which is all the traffic the trial makes; the harness's switch port also "
          "degrades traffic to other addresses (DNS, the kubelet), which is left alone here")


@dataclass(frozen=True)
class ChaosPart:
    """One chaos object of an on-phase: its template type and spec."""

    kind: str                 # "NetworkChaos" | "PodChaos"
    spec: dict[str, Any]


@dataclass(frozen=True)
class FaultMapping:
    parts: tuple[ChaosPart, ...]
    exact: tuple[str, ...]           # notes on what is the same as under the harness
    approximated: tuple[str, ...]    # notes on what differs, and how


def percent_text(fraction: float) -> str:
    """A fraction as Chaos Mesh's percentage: a float string without "%" ("20" for 20%)."""
    return f"{fraction * 100:.10g}"


def refuse(where: str, fault: FaultBase, why: str) -> UsageError:
    return UsageError(f"{where}: {fault.kind} has no exact equivalent in Chaos Mesh: {why}; "  # type: ignore[attr-defined]
                      "run this scenario with `chaos run`, or change the fault")


def _shaped(pods: Pods, ranks: tuple[int, ...], fault: LinkFault, action: str,
            params: dict[str, Any]) -> dict[str, Any]:
    """A traffic-control action on the ranks' link, each way as the fault's direction says."""
    return {"action": action, **pods.ranks(ranks), **params, "direction": _DIRECTIONS[fault.direction],
            "target": pods.everyone()}


def _direction_note(fault: LinkFault) -> str:
    return (f"direction {fault.direction} -> Chaos Mesh direction {_DIRECTIONS[fault.direction]} with the "
            "job's pods as target: the way out of the rank is shaped at its egress, the way in at each "
            "sender's; every packet passes one such qdisc, as it passes the harness's switch port")


_TOTAL_LOSS = {"loss": {"loss": "100", "correlation": "0"}}
_NOT_PARTITION = ("not the partition action: its iptables rules in the pod's own stack answer the pod's "
                  "sends with EPERM instead of silence")


def _partition_parts(pods: Pods, fault: Partition, targets: tuple[int, ...], world: int,
                     where: str) -> tuple[ChaosPart, ...]:
    """100% loss between the groups: group i against every later group (only the first group
    against the rest for one_way)."""
    if fault.groups is None:
        groups = [targets, tuple(r for r in range(world) if r not in targets)]
    else:
        groups = [tuple(sorted(_rank_of(ref, world, where) for ref in group)) for group in fault.groups]
    pairs = range(1) if fault.direction == "one_way" else range(len(groups) - 1)
    direction = "to" if fault.direction == "one_way" else "both"
    parts = []
    for i in pairs:
        others = tuple(sorted(r for group in groups[i + 1:] for r in group))
        parts.append(ChaosPart("NetworkChaos", {
            "action": "loss", **pods.ranks(groups[i]), **_TOTAL_LOSS,
            "direction": direction, "target": pods.ranks(others)}))
    return tuple(parts)


def _rank_of(ref: int | str, world: int, where: str) -> int:
    rank = ref if isinstance(ref, int) else host_index(ref) if re.fullmatch(r"r\d{3,}", ref) else None
    if rank is None or not 0 <= rank < world or (isinstance(ref, str) and host_name(rank) != ref):
        raise UsageError(f"{where}.groups: {ref!r} is not a rank of this cluster (0..{world - 1} or "
                         f"{host_name(0)}..{host_name(world - 1)})")
    return rank


def _link_action(fault: LinkFault, where: str) -> tuple[str, dict[str, Any], tuple[str, ...], tuple[str, ...]]:
    """(Chaos Mesh action, its parameters, exact notes, approximated notes) of a link fault."""
    if isinstance(fault, Loss):
        if fault.burst is not None or fault.correlation:
            raise refuse(where, fault, "the harness's loss with memory is a Markov chain (P(lost | previous "
                                       "lost) = correlation + (1 - correlation) x percent, or Gilbert-Elliott "
                                       "bursts); Chaos Mesh passes its correlation to netem's correlated "
                                       "random source, which is not that chain")
        return "loss", {"loss": {"loss": percent_text(fault.percent), "correlation": "0"}}, (
            "netem loss with the harness's probability",), ()
    if isinstance(fault, Delay):
        if fault.distribution != "uniform":
            raise refuse(where, fault, f"Chaos Mesh has no delay distribution; its jitter is netem's default "
                                       f"(uniform), not {fault.distribution}")
        return "delay", {"delay": {"latency": duration_text(fault.latency), "jitter": duration_text(fault.jitter),
                                   "correlation": percent_text(fault.correlation)}}, (
            "netem latency, uniform jitter and its correlation, as the harness sets them",), (
            "netem's queue: Chaos Mesh keeps netem's default limit of 1000 packets where the harness sizes "
            "it for 10 Gbit/s across the delay; with more than 1000 packets in flight, Chaos Mesh drops",)
    if isinstance(fault, (Duplicate, Corrupt)):
        return fault.kind, {fault.kind: {fault.kind: percent_text(fault.percent),
                                         "correlation": percent_text(fault.correlation)}}, (
            f"netem {fault.kind} probability and correlation, as the harness sets them",), ()
    if isinstance(fault, Reorder):
        return "delay", {"delay": {"latency": duration_text(fault.latency), "reorder": {
            "reorder": percent_text(fault.percent), "correlation": percent_text(fault.correlation), "gap": 1}}}, (
            "netem delay with reorder, gap 1 (any packet may go ahead), as the harness sets it",), ()
    if isinstance(fault, Bandwidth):
        rate, burst, limit = tbf_sizes(fault.rate, fault.burst)
        way_in = () if fault.direction == "from_host" else (
            "the way into the rank is capped by one token bucket at each sending pod (Chaos Mesh shapes at "
            "the sender), not one for all of them: together they may send up to (pods - 1) x the rate; a "
            "ring all-reduce receives from one peer at a time",)
        return "bandwidth", {"bandwidth": {"rate": f"{rate}bps", "limit": limit, "buffer": burst}}, (
            f"tbf with the harness's parameters: {rate} bytes/s (Chaos Mesh's \"bps\" is bytes per second), "
            f"burst (buffer) {burst} bytes, queue (limit) {limit} bytes",), way_in
    if isinstance(fault, Blackhole):
        return "loss", _TOTAL_LOSS, ("netem loss 100%: the link stays up and every packet vanishes on the "
                                     "wire, as the blackhole qdisc does", _NOT_PARTITION), ()
    if isinstance(fault, LinkDown):
        return "loss", _TOTAL_LOSS, (_NOT_PARTITION,), (
            "link down as netem loss 100% both ways: Chaos Mesh cannot take a pod's link down, so the rank's "
            "eth0 keeps its carrier; every packet vanishes as on a pulled cable, but the rank's stack is not "
            "told the link is gone",)
    raise refuse(where, fault, "no mapping is defined for this kind")


# Kinds Chaos Mesh has nothing faithful for, each with why (the first that matches: a FUSE
# storage fault is a storage fault too).
NO_EQUIVALENT: tuple[tuple[type[FaultBase], str], ...] = (
    (FuseStorageFault, "the export maps no volume for the rank's checkpoint folder yet (IOChaos's fault and "
                       "latency actions on that volume would be the equivalent of io_error and io_delay; "
                       "io_stall and lose_unsynced have none)"),
    (StorageFault, "it mounts over the rank's checkpoint folder (a full or read-only disk); Chaos Mesh's IOChaos "
                   "injects errors and latency into a volume's calls, neither a size cap nor a read-only mount"),
    (Pause, "it has no way to freeze a process (SIGSTOP ... SIGCONT): pod-failure swaps the container's image for "
            "a pause image, so the rank restarts from scratch, and container-kill kills it"),
    (Slow, "Chaos Mesh's StressChaos adds CPU load beside the rank; it cannot cap the rank's own CPU share (the "
           "harness's SIGSTOP/SIGCONT duty cycle)"),
    (StepDelay, "the rank waits before each step on a command file the harness writes in its run folder; "
                "Chaos Mesh has no fault a training step waits on (its IOChaos latency is on a volume's calls)"),
)


def map_fault(planned: PlannedFault, fault: FaultBase, pods: Pods, world: int, rank_container: str,
              where: str) -> FaultMapping:
    """The chaos objects of one on-phase of `planned` (whose value is `fault`), and the notes
    on the mapping. Raises UsageError for a fault Chaos Mesh cannot inject as the harness does."""
    ranks = planned.targets
    for kind, why in NO_EQUIVALENT:
        if isinstance(fault, kind):
            raise refuse(where, fault, why)
    if isinstance(fault, Kill):
        if fault.signal != signal.SIGKILL:
            raise refuse(where, fault, f"container-kill sends SIGKILL only and pod-kill deletes the pod; "
                                       f"{signal.Signals(fault.signal).name} cannot be sent")
        spec = {"action": "container-kill", **pods.ranks(ranks), "containerNames": [rank_container]}
        return FaultMapping((ChaosPart("PodChaos", spec),), (
            "container-kill: the container runtime sends SIGKILL to the rank's process (PID 1 of its "
            "container); its pod restarts nothing (restartPolicy Never), so the rank does not come back, "
            "as under the harness",
            "not pod-kill: the pod would be deleted and the operator would make a new one, a new rank "
            "process joining the job"), ())
    if isinstance(fault, Partition):
        parts = _partition_parts(pods, fault, ranks, world, where)
        return FaultMapping(parts, (
            "netem loss 100% between the groups' rank pods, on the wire as the harness's switch drops it; "
            "the control plane stays reachable from every rank, as on the harness's switch", _NOT_PARTITION,
            f"{len(parts)} NetworkChaos per on-phase: each group against every later group"
            + (" (one_way: the first group's traffic to the others only, direction to)"
               if fault.direction == "one_way" else "")), ())
    if isinstance(fault, LinkFault):
        action, params, exact, approximated = _link_action(fault, where)
        return FaultMapping((ChaosPart("NetworkChaos", _shaped(pods, ranks, fault, action, params)),),
                            (*exact, _direction_note(fault)), (*approximated, _SCOPE))
    raise refuse(where, fault, "no mapping is defined for this kind")


# -- the Workflow -------------------------------------------------------------------------

def phases(plan: TrialPlan, index: int) -> list[tuple[float, float | None]]:
    """(on, off) offsets after warm-up of every on-phase of fault `index`, from the plan's
    actions; off is None for a phase that never heals."""
    spans: list[tuple[float, float | None]] = []
    for action in plan.actions:
        if action.index != index:
            continue
        if action.verb == APPLY:
            spans.append((action.at, None))
        else:
            spans[-1] = (spans[-1][0], action.at)
    return spans


def template_name(index: int, phase: int, part: int) -> str:
    return f"f{index}-on{phase}-p{part}"


def _chaos_template(name: str, part: ChaosPart, deadline: str | None) -> dict[str, Any]:
    template: dict[str, Any] = {"name": name, "templateType": part.kind}
    if deadline is not None:
        template["deadline"] = deadline
    template[part.kind[0].lower() + part.kind[1:]] = part.spec
    return template


def workflow(plan: TrialPlan, mappings: list[FaultMapping], name: str, namespace: str) -> dict[str, Any]:
    """The Workflow of the plan's timeline, one serial lane per fault, the lanes in parallel."""
    templates: list[dict[str, Any]] = []
    lanes = []
    for planned, mapping in zip(plan.faults, mappings, strict=True):
        lane, t = f"fault{planned.index}", 0.0
        steps = []
        for n, (on, off) in enumerate(phases(plan, planned.index), start=1):
            if on > t:
                wait = f"f{planned.index}-wait{n}"
                templates.append({"name": wait, "templateType": "Suspend", "deadline": duration_text(on - t)})
                steps.append(wait)
            deadline = None if off is None else duration_text(off - on)
            parts = [template_name(planned.index, n, k) for k in range(len(mapping.parts))]
            templates += [_chaos_template(p, part, deadline) for p, part in zip(parts, mapping.parts, strict=True)]
            if len(parts) == 1:
                steps.append(parts[0])
            else:
                together = f"f{planned.index}-on{n}"
                templates.append({"name": together, "templateType": "Parallel", "children": parts,
                                  **({} if deadline is None else {"deadline": deadline})})
                steps.append(together)
            t = on if off is None else off
        templates.append({"name": lane, "templateType": "Serial", "children": steps})
        lanes.append(lane)
    templates.insert(0, {"name": "timeline", "templateType": "Parallel", "children": lanes})
    return {"apiVersion": API_VERSION, "kind": "Workflow",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"entry": "timeline", "templates": templates}}


def workflow_notes(plan: TrialPlan, mappings: list[FaultMapping]) -> list[str]:
    """The comment above the Workflow: what each fault became, exact and approximated."""
    lines = [f"The trial's faults, offsets after warm-up: apply this Workflow once every rank made its "
             f"{plan.warmup_steps} warm-up steps (`chaos collect k8s` says when). Suspend templates wait for the "
             "offsets and a chaos template's deadline is its on-phase; Chaos Mesh runs them node after node, "
             "each hop adding its controller's reconcile latency. The fault times in the run folder are those "
             "Chaos Mesh recorded, in whole seconds."]
    for planned, mapping in zip(plan.faults, mappings, strict=True):
        spans = ", ".join(f"+{duration_text(on)}" + ("" if off is None else f" for {duration_text(off - on)}")
                          for on, off in phases(plan, planned.index))
        lines += ["", f"faults.{planned.index}: {planned.description} on {ranks_text(planned.targets)}, {spans}"]
        lines += [f"  exact: {note}" for note in mapping.exact]
        lines += [f"  approximated: {note}" for note in mapping.approximated]
    return lines
