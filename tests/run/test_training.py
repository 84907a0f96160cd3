"""build_training puts the step together in the one order that works (ddp_utils/run/training.py): the rules hold on
what it returns, on the CPU, in one process."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from ddp_utils.distributed import DistInfo
from ddp_utils.hyp import load_hyp
from ddp_utils.run import options
from ddp_utils.run.start import Run
from ddp_utils.run.training import build_training, prepare_model
from ddp_utils.yolo import Model, load_model_yaml

LABELS = [np.array([[0, 0.5, 0.5, 0.2, 0.2], [1, 0.3, 0.3, 0.1, 0.1]], dtype=np.float32)] * 4


def a_run(**changes) -> Run:
    parser = argparse.ArgumentParser()
    options.add_train_options(parser)
    opt = parser.parse_args(["--device", "cpu", "--weights", "", "--cfg", "yolov5n.yaml"])
    hyp = load_hyp("hyp.scratch-low.yaml")
    fields = dict(opt=opt, save_dir=None, run_key="test", data={}, hyp=hyp, hyp_source="hyp.scratch-low.yaml")
    fields.update(epochs=3, amp="off", nc=2, names={0: "a", 1: "b"}, imgsz=64, batch_size=4)
    return Run(**{**fields, **changes})


def a_model() -> Model:
    """yolov5n's layers at an eighth of its width: the same structure (BatchNorm, a Detect head), built fast."""
    torch.manual_seed(0)
    return Model({**load_model_yaml("yolov5n.yaml")[0], "width_multiple": 0.0625}, ch=3, nc=2)


def build(run: Run, model: Model):
    loaders = ([0] * 5, [0] * 2)  # build_training reads only the number of batches per epoch
    return build_training(run, model, torch.device("cpu"), DistInfo(), 32, (*loaders, LABELS))


def test_the_step_holds_the_model_the_optimizer_optimises_and_the_guard_watches_its_batchnorm():
    model = a_model()
    fit = build(a_run(), model)
    step = fit.step
    assert step.model is model  # one process: no wrapper
    optimised = {id(p) for group in step.optimizer.param_groups for p in group["params"]}
    assert optimised == {id(p) for p in model.parameters()}
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    storages = {bn.running_mean.untyped_storage().data_ptr() for bn in bns}
    assert len(bns) > 1 and len(storages) == 1, "the guard's flat statistics are the model's, made after every wrapper"
    assert step.ema.ema is not model and fit.state.epoch == 0 and fit.scheduler.last_epoch == fit.state.epoch - 1


def test_channels_last_reaches_the_model_and_the_emas_copy_before_the_optimizer_keeps_them():
    model = a_model()
    fit = build(a_run(channels_last=True), model)
    convs = [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size != (1, 1)]
    ema_convs = [m.weight for m in fit.step.ema.ema.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    assert all(w.is_contiguous(memory_format=torch.channels_last) for w in ema_convs if w.shape[-1] > 1)
    optimised = [p for group in fit.step.optimizer.param_groups for p in group["params"]]
    assert any(p is w for p in optimised for w in convs), "the optimizer holds the converted parameters themselves"


@pytest.mark.parametrize("weights, initialised", [("", True), ("yolov5n.pt", False)])
def test_a_new_run_starts_the_class_biases_at_the_label_counts_and_a_fine_tune_keeps_its_own(weights, initialised):
    run = a_run()
    run = run.replace(opt=argparse.Namespace(**{**vars(run.opt), "weights": weights}))
    model, fresh = a_model(), a_model()
    prepare_model(run, model, LABELS)
    head, fresh_head = model.model[-1], fresh.model[-1]
    same = all(torch.equal(a.bias, b.bias) for a, b in zip(head.m, fresh_head.m))
    assert same is not initialised
