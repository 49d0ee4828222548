"""A training state's fingerprint: 16 hex digits that equal replicas always share.

Per tensor (or run of small tensors), computed where it lives (on the GPU for a CUDA model), two integers over the
tensor's bit pattern (its bytes read as 32-bit words):

    total       the sum of every word modulo 2^32 (an int32 reduction, which wraps):
                integer addition modulo 2^32 is exact and associative, so the total does
                not depend on the order a reduction takes, the number of threads or the
                kernel: bitwise-equal tensors always agree. Floating-point sums (float64
                included) are not associative, so two equal replicas reduced in another
                order could disagree; an int64 accumulation is exact too but ten times
                slower on a CPU (it widens every word: bench/state_fingerprint.py).
    positional  the words of a strided sample (SAMPLE_WORDS, evenly spaced), each times a
                fixed pseudo-random weight below 2^20: a change that keeps the total
                (words swapped, opposite changes) still moves it.

Small tensors on one device are joined first and reduced as one (a small model costs a
pass, not a few kernel launches per tensor). One transfer to the host per device, then a BLAKE2b hash of those integers with every
tensor's dtype and shape. Replicas that diverged differ in nearly every word of every
tensor they updated: a collision needs both integers of every such tensor to agree by
chance (about 2^-32 for the total alone, per tensor). Cost: two reductions per tensor
(bench/state_fingerprint.py measures it against a step).
"""
from __future__ import annotations

import hashlib
from typing import Any, Iterable, Mapping

import torch

SAMPLE_WORDS = 1024
SMALL_WORDS = 1 << 20  # tensors below this many words are reduced together (a copy of at most a few MB)
_NARROW = {1: torch.uint8, 2: torch.int16}  # words of a tensor whose size is no multiple of 4 bytes
_weights: dict[tuple[int, torch.device], torch.Tensor] = {}


def _sample_weights(n: int, device: torch.device) -> torch.Tensor:
    key = (n, device)
    if key not in _weights:
        draw = torch.Generator().manual_seed(0x5A17)
        _weights[key] = torch.randint(1, 1 << 20, (n,), generator=draw, dtype=torch.int64).to(device)
    return _weights[key]


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as 32-bit words (as 8- or 16-bit ones when its size is no multiple
    of 4 bytes): a view, no copy, for a contiguous tensor. A DTensor: its local shard."""
    if hasattr(tensor, "to_local"):
        tensor = tensor.to_local()
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    if (flat.numel() * flat.element_size()) % 4 == 0:
        return flat.view(torch.int32)
    return flat.view(_NARROW[flat.element_size()])


def tensors_of(obj: Any) -> list[torch.Tensor]:
    """The tensors of a model (its parameters and buffers), an optimizer (its parameters),
    a state dict or a list of tensors, in a fixed order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, torch.nn.Module):
        return [t for _, t in sorted(obj.state_dict(keep_vars=True).items())]
    if isinstance(obj, torch.optim.Optimizer):
        return [p for group in obj.param_groups for p in group["params"]]
    if isinstance(obj, dict):
        return [t for _, value in sorted(obj.items(), key=lambda kv: str(kv[0])) for t in tensors_of(value)]
    if isinstance(obj, (list, tuple)):
        return [t for value in obj for t in tensors_of(value)]
    return []


SHARDED_PARAMETERS, SHARDED_OPTIMIZER = "params", "optim"


def sharding(holder: Any) -> str | None:
    """What of a holder's state differs between ranks by design, so is no replica's:
    "params" when the parameters are shards (FSDP's FlatParameter or its flattened views,
    DTensor: the optimizer state with them), "optim" when only the optimizer's state is
    (ZeroRedundancyOptimizer), None when every rank holds all of it."""
    def shard(t: torch.Tensor) -> bool:
        names = {c.__name__ for c in type(t).__mro__}
        return bool(names & {"DTensor", "FlatParameter"}) or bool(getattr(t, "_fsdp_flattened", False))
    if any(shard(t) for t in tensors_of(holder)):
        return SHARDED_PARAMETERS
    if type(holder).__name__ == "ZeroRedundancyOptimizer":
        return SHARDED_OPTIMIZER
    return None


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """What the optimizer holds per parameter (momentum, Adam's moments), in parameter order;
    for one that keeps it in a local optimizer (ZeroRedundancyOptimizer's `optim`), that one's."""
    inner = getattr(optimizer, "optim", None)
    if isinstance(inner, torch.optim.Optimizer) and inner is not optimizer:
        return optimizer_tensors(inner)
    return [t for group in optimizer.param_groups for p in group["params"]
            for _, t in sorted(optimizer.state.get(p, {}).items()) if isinstance(t, torch.Tensor)]


def _runs(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors' words, small neighbours on one device joined into one run (each
    reduction then covers many tensors: a small model's tensors cost one pass, not a few
    kernel launches each); a tensor of SMALL_WORDS or more is its own run, never copied."""
    runs: list[torch.Tensor] = []
    pending: list[torch.Tensor] = []
    for words in map(_words, tensors):
        if pending and (words.device != pending[0].device or words.dtype != pending[0].dtype
                        or words.numel() >= SMALL_WORDS):
            runs.append(torch.cat(pending) if len(pending) > 1 else pending[0])
            pending = []
        (runs.append if words.numel() >= SMALL_WORDS else pending.append)(words)
    if pending:
        runs.append(torch.cat(pending) if len(pending) > 1 else pending[0])
    return runs


def fingerprints(*groups: Iterable[torch.Tensor]) -> list[str | None]:
    """The fingerprint of each group of tensors (None for an empty one), from one transfer
    per device for all groups: on a GPU each transfer waits for the device (a model's and its
    optimizer's state in one call: one wait, not two)."""
    groups_ = [list(g) for g in groups]
    integers: dict[torch.device, list[torch.Tensor]] = {}  # per device: every group's, in order
    spans: list[list[tuple[torch.device, int, int]]] = []  # per group: (device, first, end) per run
    for tensors in groups_:
        spans.append([])
        for words in _runs(tensors):
            n = words.numel()
            stride = max(1, n // SAMPLE_WORDS)
            sample = words[::stride][:SAMPLE_WORDS].to(torch.int64)
            on_device = integers.setdefault(words.device, [])
            spans[-1].append((words.device, len(on_device), len(on_device) + 2))
            on_device.extend((words.sum(dtype=torch.int32).to(torch.int64),
                              (sample * _sample_weights(sample.numel(), sample.device)).sum()))
    host = {device: torch.stack(values).cpu().numpy() for device, values in integers.items()}
    results: list[str | None] = []
    for tensors, runs in zip(groups_, spans, strict=True):
        if not tensors:
            results.append(None)
            continue
        digest = hashlib.blake2b(digest_size=8)
        for device in dict.fromkeys(device for device, _, _ in runs):  # per device, as first met
            digest.update(b"".join(host[device][first:end].tobytes() for d, first, end in runs if d == device))
        digest.update(";".join(f"{t.dtype}{tuple(t.shape)}" for t in tensors).encode())
        results.append(digest.hexdigest())
    return results


def fingerprint(tensors: Iterable[torch.Tensor]) -> str | None:
    """The fingerprint of these tensors' values; None when there are none."""
    return fingerprints(tensors)[0]


def part_fingerprints(state: Mapping[str, Any]) -> dict[str, str]:
    """One fingerprint per entry of a training state (a framework's state dict: the model's,
    the optimizer's, the LR scheduler's, the data loader's position): of its tensors and of
    its other values (an LR scheduler's step, a sampler's epoch and offset), so that a
    verdict can name which part of a state differs."""
    named = [(str(key), *_leaves(value)) for key, value in state.items()]
    found = fingerprints(*(tensors for _, tensors, _ in named))
    parts = {}
    for (key, _, plain), tensors_fp in zip(named, found, strict=True):
        digest = hashlib.blake2b(repr(plain).encode(), digest_size=8)
        digest.update((tensors_fp or "").encode())
        parts[key] = digest.hexdigest()
    return parts


def _leaves(value: Any) -> tuple[list[torch.Tensor], list[tuple[tuple[Any, ...], str]]]:
    """The tensors of a nested value (dicts, lists) in a fixed order, and its other values
    with their paths."""
    tensors: list[torch.Tensor] = []
    plain: list[tuple[tuple[Any, ...], str]] = []

    def walk(item: Any, path: tuple[Any, ...]) -> None:
        if isinstance(item, torch.Tensor):
            tensors.append(item)
        elif isinstance(item, Mapping):
            for key in sorted(item, key=str):
                walk(item[key], (*path, str(key)))
        elif isinstance(item, (list, tuple)):
            for index, element in enumerate(item):
                walk(element, (*path, index))
        else:
            plain.append((path, repr(item)))
    walk(value, ())
    return tensors, plain
