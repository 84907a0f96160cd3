"""Names shared with YOLOv5 on its own objects: its Detect head in ComputeLoss, its last.pt in strip_optimizer.

YOLOv5's classes are the stand-ins of tests/yolo/yolov5_standins.py (written from the published
architecture; YOLOv5 is never imported). Checkpoints are saved with them at YOLOv5's module paths,
which are removed from sys.modules before ddp_utils reads the file.
"""

from __future__ import annotations

import sys
from copy import deepcopy
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from ddp_utils.run import strip_optimizer
from ddp_utils.run.checkpoint import UnsafeCheckpointError
from ddp_utils.yolo import ComputeLoss
from ddp_utils.yolo.foreign import read_yolov5_checkpoint, yolov5_model
from ddp_utils.yolo.head import detection_head

from . import yolov5_standins as v5
from .test_foreign import CONFIGS, save_yolov5

HYP = {"box": 0.05, "obj": 1.0, "cls": 0.5, "cls_pw": 1.0, "obj_pw": 1.0, "anchor_t": 4.0}


def standin(nc: int = 3) -> v5.DetectionModel:
    cfg = yaml.safe_load((CONFIGS / "yolov5n.yaml").read_text())
    return v5.build({**cfg, "nc": nc})


def test_compute_loss_takes_yolov5s_own_detect_head_and_gives_our_models_loss(tmp_path: Path) -> None:
    reference = standin()
    path = save_yolov5(v5.yolov5_checkpoint(reference), tmp_path / "w.pt")
    ours, _ = yolov5_model(read_yolov5_checkpoint(path), str(path))  # the same weights in our Model
    yolov5 = deepcopy(reference).half().float()  # the weights as the file holds them
    assert type(detection_head(yolov5)).__name__ == "Detect" and not isinstance(
        detection_head(yolov5), type(ours.model[-1])
    )
    yolov5.hyp = HYP  # YOLOv5's train.py sets model.hyp, then calls ComputeLoss(model)
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.2, 0.3], [1, 2, 0.3, 0.6, 0.1, 0.2], [1, 0, 0.7, 0.2, 0.3, 0.3]])
    loss_v5, items_v5 = ComputeLoss(yolov5)(yolov5.train()(x.clone()), targets)
    loss_ours, items_ours = ComputeLoss(ours, HYP)(ours.train()(x.clone()), targets)
    assert float(loss_v5.detach()) > 0
    torch.testing.assert_close(loss_v5, loss_ours, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(items_v5, items_ours, rtol=1e-5, atol=1e-6)


def test_compute_loss_on_a_model_without_a_detection_head_names_what_is_missing() -> None:
    class NotAHead(nn.Module):
        nl, na = 3, 3

    model = nn.Module()
    model.model = nn.Sequential(nn.Conv2d(3, 8, 1), NotAHead())
    with pytest.raises(
        TypeError, match=r"NotAHead is not a YOLOv5-style detection head: it has no anchors, stride, nc"
    ):
        ComputeLoss(model, HYP)


def yolov5_training_checkpoint(model: v5.DetectionModel, epoch: int) -> dict:
    """What YOLOv5's train.py saves as last.pt mid-run: model and EMA (fp16), optimizer, updates, best_fitness."""
    ema = deepcopy(model)
    with torch.no_grad():
        for p in ema.parameters():
            p.add_(0.01)  # the EMA differs from the model: the stripped file must keep the EMA's weights
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.zeros(1, 3, 64, 64))[0].sum().backward()
    optimizer.step()
    ckpt = v5.yolov5_checkpoint(model, epoch=epoch)
    ckpt.update(ema=deepcopy(ema).half(), updates=123, optimizer=optimizer.state_dict(),
                best_fitness=np.array([0.42]))  # fmt: skip
    ckpt["ema"].names, ckpt["ema"].nc = ckpt["model"].names, ckpt["model"].nc
    return ckpt


def test_strip_optimizer_strips_yolov5s_own_last_pt_without_running_it(tmp_path: Path) -> None:
    model = standin()
    ckpt = yolov5_training_checkpoint(model, epoch=7)
    ema_weights = {k: v.clone() for k, v in ckpt["ema"].state_dict().items()}
    path = save_yolov5(ckpt, tmp_path / "last.pt")
    out = strip_optimizer(path, tmp_path / "best.pt")  # YOLOv5's call form: strip_optimizer(f, s)
    assert out == tmp_path / "best.pt"
    assert not any(name == "models" or name.startswith("models.") for name in sys.modules)  # nothing imported
    assert out.stat().st_size < path.stat().st_size
    with v5.yolov5_modules():  # with YOLOv5's code present, the file loads as YOLOv5's own
        stripped = torch.load(out, map_location="cpu", weights_only=False)
    assert isinstance(stripped["model"], v5.DetectionModel) and isinstance(stripped["model"].model[2], v5.C3)
    assert stripped["epoch"] == -1
    assert [stripped[k] for k in ("optimizer", "best_fitness", "ema", "updates")] == [None] * 4
    assert stripped["opt"] == ckpt["opt"] and stripped["date"] == ckpt["date"]
    state = stripped["model"].state_dict()
    assert set(state) == set(ema_weights)
    for name, tensor in ema_weights.items():  # the EMA's weights, in half precision
        assert state[name].dtype == (torch.float16 if tensor.is_floating_point() else tensor.dtype), name
        assert torch.equal(state[name], tensor), name
    assert not any(p.requires_grad for p in stripped["model"].parameters())
    assert stripped["model"].model[-1].stride.dtype == torch.float16  # YOLOv5's _apply halves Detect's stride
    out_z, _ = stripped["model"].float().eval()(torch.rand(1, 3, 64, 64))
    assert out_z.shape == (1, 3 * (8 * 8 + 4 * 4 + 2 * 2), 8) and torch.isfinite(out_z).all()


def test_strip_optimizer_in_place_on_yolov5s_file_as_yolov5_calls_it(tmp_path: Path) -> None:
    path = save_yolov5(yolov5_training_checkpoint(standin(), epoch=2), tmp_path / "last.pt")
    assert strip_optimizer(path) == path  # s="" overwrites f
    read = read_yolov5_checkpoint(path)  # our reader takes the stripped file too
    assert read["epoch"] == -1 and read["class_path"] == "models.yolo.DetectionModel"
    assert all(t.dtype == torch.float16 for t in read["state_dict"].values() if t.is_floating_point())


def test_strip_optimizer_on_a_foreign_model_that_is_not_yolov5s_says_what_to_use(tmp_path: Path) -> None:
    ckpt = yolov5_training_checkpoint(standin(), epoch=2)
    ckpt["model"] = ckpt["ema"] = v5.C3(8, 8)  # YOLOv5's classes, but no detection model
    path = save_yolov5(ckpt, tmp_path / "odd.pt")
    with pytest.raises(UnsafeCheckpointError, match="strip it with YOLOv5's own strip_optimizer") as info:
        strip_optimizer(path)
    assert "\n" not in str(info.value) and "models.common.C3" in str(info.value)
