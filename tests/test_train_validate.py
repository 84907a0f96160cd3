"""train.py's ``validate``: the EMA is validated in the precision the run trains in (a bf16 run in bf16, not fp16)."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.workers.yolo_scenarios import build_stub, make_batches, make_images
from tests.yolo.test_evaluate import ConvProbe

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def train_py():
    spec = importlib.util.spec_from_file_location("train_under_test", REPO / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Watchdog:
    """The stall watchdog's two calls validation makes, without its thread: it is not what is tested here."""

    def track(self, iterable, phase):
        return iterable

    def phase(self, name, limit):
        return contextlib.nullcontext()


@pytest.mark.parametrize(("amp", "dtype"), [("bf16", torch.bfloat16), ("off", torch.float32)])
def test_validation_runs_the_ema_in_the_runs_precision(train_py, amp, dtype):
    images = make_images(4, jitter=4.0, misses=True)
    model, compute_loss = build_stub(images)
    probe = ConvProbe(model)
    ema = SimpleNamespace(ema=probe, sync=lambda: None)
    fit = SimpleNamespace(step=SimpleNamespace(ema=ema, compute_loss=compute_loss), val_loader=make_batches(images, 2))
    opt = SimpleNamespace(noval=False, verbose=False)
    run = SimpleNamespace(opt=opt, epochs=3, amp=amp, names={0: "a", 1: "b", 2: "c"})
    records = SimpleNamespace(control=SimpleNamespace(stop_requested=lambda: False), watchdog=Watchdog())
    metrics, val_loss = train_py.validate(run, fit, torch.device("cpu"), 0, records)
    assert {dtype for _, dtype in probe.seen} == {dtype}  # before: fp32 on the CPU whatever the run trained in
    assert set(metrics) == {"precision", "recall", "map50", "map"} and val_loss.shape == (3,)
