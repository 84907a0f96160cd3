"""wrap_model in a real (one-rank) gloo group: what --sync-bn converted is said once, torch's deprecation is not."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddp_utils.engine import wrap_model
from tests.multiproc import free_port


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_sync_bn_says_what_it_converted_and_ddp_warns_nothing(one_rank_group, caplog):
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8))
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO, logger="ddp_utils"):
        warnings.simplefilter("always")
        wrapped = wrap_model(model, torch.device("cpu"), distributed=True, sync_bn=True)
    assert [r.getMessage() for r in caplog.records if "--sync-bn" in r.getMessage()] == [
        "--sync-bn: 2 BatchNorm layers -> GroupBatchNorm (ddp_utils, gloo)"
    ]
    assert not [w for w in caught if "broadcast_buffers" in str(w.message)], [str(w.message) for w in caught]
    wrapped(torch.rand(2, 3, 12, 12)).sum().backward()  # and it trains


def test_a_model_without_batchnorm_says_so(one_rank_group, caplog):
    with caplog.at_level(logging.INFO, logger="ddp_utils"):
        wrap_model(nn.Linear(2, 2), torch.device("cpu"), distributed=True, sync_bn=True)
    assert any("no BatchNorm layer: nothing to synchronise" in r.getMessage() for r in caplog.records)
