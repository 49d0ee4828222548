"""harness.job.fingerprint: equal replicas always agree, changed ones differ."""
from __future__ import annotations

import copy

import pytest
import torch

from harness.job.fingerprint import SAMPLE_WORDS, fingerprint, optimizer_tensors, tensors_of


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def test_a_copy_agrees_and_one_ulp_anywhere_differs():
    a, b = model(), copy.deepcopy(model())
    assert fingerprint(tensors_of(a)) == fingerprint(tensors_of(b))
    with torch.no_grad():
        weight = b[0].weight.view(-1)
        weight[12345] = torch.nextafter(weight[12345], torch.tensor(1.0))
    assert fingerprint(tensors_of(a)) != fingerprint(tensors_of(b))


def test_words_swapped_at_sampled_places_keep_the_total_and_still_differ():
    t = torch.randn(10 * SAMPLE_WORDS)
    swapped = t.clone()
    stride = t.numel() // SAMPLE_WORDS
    swapped[0], swapped[stride] = t[stride], t[0]
    assert fingerprint([t]) != fingerprint([swapped])


def test_the_same_bytes_in_another_shape_or_dtype_differ():
    t = torch.arange(12, dtype=torch.float32)
    assert fingerprint([t]) != fingerprint([t.view(3, 4)])
    assert fingerprint([t]) != fingerprint([t.view(torch.int32)])


def test_every_dtype_and_size_has_one():
    tensors = [torch.ones(3, dtype=torch.bool), torch.ones(3, dtype=torch.float16), torch.zeros(0),
               torch.ones(5, dtype=torch.float64), torch.arange(7, dtype=torch.uint8), torch.randn(2, 3).t()]
    assert len(fingerprint(tensors)) == 16 and fingerprint([]) is None


def test_the_optimizer_state_is_its_own_fingerprint():
    m = model()
    optimizer = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    assert optimizer_tensors(optimizer) == []  # no momentum before the first step
    m(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    first = fingerprint(optimizer_tensors(optimizer))
    assert first is not None and fingerprint(tensors_of(optimizer)) == fingerprint(list(m.parameters()))
    optimizer.state[m[0].weight]["momentum_buffer"].mul_(0.5)
    assert fingerprint(optimizer_tensors(optimizer)) != first


@pytest.mark.requires_gpu
def test_a_tensor_on_the_gpu_has_the_fingerprint_it_has_on_the_cpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    tensors = tensors_of(model())
    assert fingerprint([t.cuda() for t in tensors]) == fingerprint(tensors)
