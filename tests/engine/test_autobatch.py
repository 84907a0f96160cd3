"""AutoBatch: the line fit on measured points, and the CPU path (a message and the default)."""

from __future__ import annotations

import logging

import pytest
import torch

from ddp_utils.engine.autobatch import MAX_BATCH_SIZE, autobatch, check_train_batch_size, fit_batch_size


def test_fit_picks_the_largest_batch_under_the_budget():
    # 0.5 GiB per image on top of 1 GiB: 11 GiB allows (11 - 1) / 0.5 = 20 images
    sizes = [1, 2, 4, 8, 16]
    memory = [1.5, 2.0, 3.0, 5.0, 9.0]
    assert fit_batch_size(sizes, memory, 11.0, default=16) == 20
    assert fit_batch_size(sizes, memory, 10.99, default=16) == 19
    # noisy measurements: the least-squares line, rounded down
    noisy = [1.6, 1.9, 3.1, 4.9, 9.1]
    assert fit_batch_size(sizes, noisy, 41.0, default=16) == 79  # (41 - 1.0) / 0.5032 = 79.5


def test_fit_never_reaches_a_size_that_ran_out_of_memory():
    assert fit_batch_size([1, 2, 4, 8, 16], [1.5, 2.0, 3.0, 5.0, None], 100.0, default=16) == 8


@pytest.mark.parametrize(
    ("sizes", "memory", "budget"),
    [
        ([1, 2], [1.0, None], 10.0),  # one point: no line
        ([1, 2, 4], [2.0, 2.0, 2.0], 10.0),  # memory does not grow: no answer
        ([1, 2, 4], [3.0, 3.5, 4.5], 1.0),  # even one image does not fit the budget
        ([1, 2, 4], [0.001, 0.002, 0.004], 100.0),  # beyond MAX_BATCH_SIZE
    ],
)
def test_fit_falls_back_to_the_default(sizes, memory, budget):
    assert fit_batch_size(sizes, memory, budget, default=16) == 16
    assert MAX_BATCH_SIZE == 1024


def test_cpu_model_gets_the_default_and_a_message(caplog):
    from ddp_utils.log import LOGGER

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))  # CPU on purpose
    LOGGER.addHandler(caplog.handler)
    old = LOGGER.level
    LOGGER.setLevel(logging.INFO)
    try:
        assert autobatch(model, imgsz=64, batch_size=12) == 12
        assert check_train_batch_size(model, imgsz=64, amp=False) == 16
    finally:
        LOGGER.removeHandler(caplog.handler)
        LOGGER.setLevel(old)
    assert "AutoBatch: no CUDA device to measure on (cpu); using the default batch size 12" in caplog.text


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_measures_and_answers_a_usable_batch():
    from ddp_utils.yolo import Model, load_model_yaml

    cfg, _ = load_model_yaml("yolov5n.yaml")
    model = Model(cfg, nc=80).cuda()
    batch = autobatch(model, imgsz=320, fraction=0.3)
    assert 1 <= batch <= MAX_BATCH_SIZE
    assert next(model.parameters()).grad is None  # the model itself was not run
