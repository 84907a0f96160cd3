"""The host-wait counter (tests/hostwait.py) itself: what it must catch, what it must not, what it cannot see.

Every test that says "0 host waits" (the training step, the loss, the EMA, the prefetcher) is only
as good as this counter, so each op it claims to catch has a positive control here, each op that
does not wait a negative one, and each blind spot the module's docstring and the README admit is
shown to be blind (if one of those tests starts failing, the counter learnt to see it: move the
case up and update the docs).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from .hostwait import HostWaitCounter

X = torch.arange(6.0)
MASK = X > 2

CAUGHT = {  # name: (the op, the wait it is recorded as)
    "item": (lambda: X.sum().item(), "_local_scalar_dense"),
    "float": (lambda: float(X[0]), "_local_scalar_dense"),
    "int": (lambda: int(X[1]), "_local_scalar_dense"),
    "bool": (lambda: bool(X[1]), "_local_scalar_dense"),
    "if tensor": (lambda: 1 if X[1] else 0, "_local_scalar_dense"),
    "f-string format": (lambda: f"{X[1]:.2f}", "_local_scalar_dense"),
    "is_nonzero": (lambda: torch.is_nonzero(X[1:2]), "_local_scalar_dense"),  # decomposed before dispatch
    "nonzero": (lambda: X.nonzero(), "nonzero"),
    "argwhere": (lambda: torch.argwhere(X), "nonzero"),
    "where(mask)": (lambda: torch.where(MASK), "nonzero"),
    "masked_select": (lambda: X.masked_select(MASK), "masked_select"),
    "unique": (lambda: X.unique(), "_unique2"),
    "unique_consecutive": (lambda: X.unique_consecutive(), "unique_consecutive"),
    "bool-mask index": (lambda: X[MASK], "index with a boolean mask"),
    "bool-mask assignment": (
        lambda: X.clone().index_put_((MASK,), torch.tensor(0.0)),
        "index_put_ with a boolean mask",
    ),
    "repeat_interleave": (
        lambda: torch.repeat_interleave(torch.tensor([1, 2])),
        "repeat_interleave without output_size",
    ),
    "equal": (lambda: torch.equal(X, X), "equal"),
    "allclose": (lambda: torch.allclose(X, X), "allclose"),
    "bincount": (lambda: torch.bincount(X.long()), "bincount"),
    "bincount(minlength)": (lambda: torch.bincount(X.long(), minlength=8), "bincount"),
    "histc without range": (lambda: torch.histc(X), "histc without a range"),
    "tolist": (lambda: X.tolist(), "Tensor.tolist()"),
    "numpy": (lambda: X.numpy(), "Tensor.numpy()"),
    "np.asarray": (lambda: np.asarray(X), "Tensor.numpy()"),
    "cpu": (lambda: X.cpu(), "Tensor.cpu()"),
    'to("cpu")': (lambda: X.to("cpu"), "Tensor.to(cpu)"),
    'to("cpu", dtype)': (lambda: X.to("cpu", torch.float64), "Tensor.to(cpu)"),
    'to(device="cpu:0")': (lambda: X.to(device="cpu:0"), "Tensor.to(cpu)"),
}

NOT_WAITS = {  # ops a step may run freely: their result's size and value stay on the device
    "arithmetic": lambda: (X * 2 + 1).sum(),
    "any/max/sort/topk": lambda: (X.any(), X.max(), X.sort(), X.topk(2)),
    "masked_fill": lambda: X.clone().masked_fill_(MASK, 0),
    "where(mask, a, b)": lambda: torch.where(MASK, X, -X),
    "integer index": lambda: X[torch.tensor([0, 2])],
    "repeat_interleave(output_size)": lambda: torch.repeat_interleave(torch.tensor([1, 2]), output_size=3),
    "histc with a range": lambda: torch.histc(X, bins=3, min=0, max=6),
    "to(dtype)": lambda: X.to(torch.float16),
    "to(cpu, dtype, non_blocking)": lambda: X.to("cpu", torch.float64, non_blocking=True),
    "clone/copy_": lambda: torch.empty(6).copy_(X),
}

CANNOT_SEE = {  # waits on a GPU that leave no trace on a CPU-only host (see tests/hostwait.py)
    "to(torch.device('cpu'))": lambda: X.to(torch.device("cpu")),  # the same call as .to(device) here
    "to(a CPU tensor)": lambda: X.to(MASK),
    "tensor constructor on a device": lambda: torch.tensor([1.0, 2.0], device="cpu"),
    "as_tensor of an array on a device": lambda: torch.as_tensor(np.ones(3), device="cpu"),
    "copy_ from another device": lambda: torch.empty(6, device="cpu").copy_(X),
}


@pytest.mark.parametrize("name", sorted(CAUGHT))
def test_each_wait_it_must_catch_is_recorded_once_at_its_line(name):
    fn, op = CAUGHT[name]
    with HostWaitCounter() as counter:
        fn()
    assert [w.op for w in counter.waits] == [op], counter.waits
    assert counter.waits[0].where.startswith("tests/test_hostwait.py:"), counter.waits[0].where
    assert counter.waits[0].within(fn)


@pytest.mark.parametrize("name", sorted(NOT_WAITS))
def test_ops_that_do_not_wait_are_not_recorded(name):
    with HostWaitCounter() as counter:
        NOT_WAITS[name]()
    assert counter.waits == [] and counter.ops > 0


@pytest.mark.parametrize("name", sorted(CANNOT_SEE))
def test_what_it_cannot_see_on_the_cpu(name):
    """A blocking host-to-device copy made by a constructor or ``copy_`` waits on a GPU; here it is a CPU copy."""
    with HostWaitCounter() as counter:
        CANNOT_SEE[name]()
    assert counter.waits == []


@pytest.mark.cuda
def test_cuda_synchronize_is_not_seen():
    """torch.cuda.synchronize (and Event/Stream synchronize) dispatch no aten op: the counter records nothing.

    Without CUDA the call fails before waiting; with CUDA it returns, and still nothing is recorded.
    """
    with HostWaitCounter() as counter:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        else:
            with pytest.raises((RuntimeError, AssertionError)):
                torch.cuda.synchronize()
    assert counter.waits == []


def test_wrapped_methods_are_restored_and_counting_stops_on_exit():
    saved = {name: torch.Tensor.__dict__.get(name) for name in ("tolist", "numpy", "cpu", "to")}
    with HostWaitCounter() as counter:
        X.tolist()
    X.tolist(), X.to("cpu"), X.sum().item()
    assert len(counter.waits) == 1
    assert all(getattr(torch.Tensor.__dict__.get(name), "__name__", name) != "read" for name in saved)
    assert X.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # the original methods, working


def _reads_the_loss(loss: torch.Tensor) -> list[float]:
    return loss.tolist()


def _helper_with_the_same_line_text(loss: torch.Tensor) -> list[float]:
    return loss.tolist()


def test_waits_are_matched_to_a_function_by_frame_not_by_text():
    loss = torch.ones(3)
    with HostWaitCounter() as counter:
        _reads_the_loss(loss)
        _helper_with_the_same_line_text(loss)
        (lambda: _reads_the_loss(loss))()  # called through another frame: still within it
    assert len(counter.within(_reads_the_loss)) == 2
    assert len(counter.within(_helper_with_the_same_line_text)) == 1
    assert [w.within(test_waits_are_matched_to_a_function_by_frame_not_by_text) for w in counter.waits] == [True] * 3


def test_reset_forgets_waits_and_ops():
    with HostWaitCounter() as counter:
        X.sum().item()
        counter.reset()
        X.sum()
    assert counter.waits == [] and counter.ops == 1 and counter.by_op == {"sum": 1}
