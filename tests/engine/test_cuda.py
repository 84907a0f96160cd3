"""The engine on a GPU: EMA of an fp16 CUDA model, CUDA tensors and AMP scaler in a checkpoint."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ddp_utils.engine import ModelEMA, smart_optimizer
from ddp_utils.run import build_checkpoint, load_checkpoint, save_checkpoint

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_ema_and_checkpoint_of_a_cuda_model(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.SiLU()).cuda()
    optimizer = smart_optimizer(model, "SGD", lr=0.01)
    scaler = torch.amp.GradScaler("cuda")
    ema = ModelEMA(model, tau=2)
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(torch.randn(2, 3, 16, 16, device="cuda")).float().square().mean()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        ema.update(model)
    assert next(ema.ema.parameters()).is_cuda and next(ema.ema.parameters()).dtype == torch.float32
    ckpt = build_checkpoint(ema.ema, optimizer=optimizer, scaler=scaler, ema_updates=ema.updates, epoch=0)
    save_checkpoint(ckpt, tmp_path / "last.pt")
    loaded = load_checkpoint(tmp_path / "last.pt")  # map_location="cpu"
    assert all(not v.is_cuda for v in loaded["model"].values())
    assert loaded["scaler"]["scale"] == scaler.get_scale()
    torch.testing.assert_close(loaded["model"]["0.weight"], ema.ema[0].weight.cpu())
