"""Names shared with YOLOv5, called the way YOLOv5's train.py and val.py call them.

Each test writes the YOLOv5 call form as YOLOv5's own scripts make it (facts read from
YOLOv5's code; none of it imported or copied) and checks that ours behaves the same:
utils/metrics.py ``fitness``, utils/general.py ``one_cycle`` and ``strip_optimizer``,
utils/torch_utils.py ``EarlyStopping`` and ``smart_optimizer``.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.optim import lr_scheduler

from ddp_utils.engine import ModelEMA, one_cycle, smart_optimizer
from ddp_utils.run import EarlyStopping, build_checkpoint, load_checkpoint, save_checkpoint, strip_optimizer
from ddp_utils.run.checkpoint import UnsafeCheckpointError
from ddp_utils.yolo import Model
from ddp_utils.yolo.metrics import fitness

MODEL_YAML = Path(__file__).resolve().parents[1] / "configs" / "models" / "yolov5n.yaml"
HYP = {"lr0": 0.01, "lrf": 0.01, "momentum": 0.937, "weight_decay": 0.0005}


@pytest.fixture(scope="module")
def model() -> Model:
    return Model(MODEL_YAML, nc=3)


def test_fitness_of_val_results_row():
    # train.py: results = (P, R, mAP@.5, mAP@.5-.95, val_box, val_obj, val_cls)
    results = (0.7, 0.6, 0.5, 0.3, 0.05, 0.02, 0.01)
    fi = fitness(np.array(results).reshape(1, -1))
    assert isinstance(fi, np.ndarray) and fi.shape == (1,) and fi[0] == pytest.approx(0.1 * 0.5 + 0.9 * 0.3)
    best_fitness = 0.0
    if fi > best_fitness:  # train.py compares the one-element array with a float
        best_fitness = fi
    assert best_fitness is fi
    # evolve: fitness over many rows, one per generation
    assert fitness(np.array([results, (0, 0, 1, 1, 0, 0, 0)])).tolist() == pytest.approx([0.32, 1.0])


def test_one_cycle_drives_lambda_lr_as_in_train_py(model):
    epochs = 10
    optimizer = smart_optimizer(model, "SGD", HYP["lr0"], HYP["momentum"], HYP["weight_decay"])
    lf = one_cycle(1, HYP["lrf"], epochs)  # cosine 1 -> hyp['lrf']
    scheduler = lr_scheduler.LambdaLR(optimizer, lr_lambda=lf)
    lrs = []
    for _ in range(epochs):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    expected = [HYP["lr0"] * (((1 - math.cos(e * math.pi / epochs)) / 2) * (HYP["lrf"] - 1) + 1) for e in range(epochs)]
    assert lrs == pytest.approx(expected)


def test_smart_optimizer_positional_call_and_group_order(model):
    optimizer = smart_optimizer(model, "SGD", HYP["lr0"], HYP["momentum"], HYP["weight_decay"])
    # YOLOv5's order: biases (no decay), weights (decay), BatchNorm weights (no decay)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.0, HYP["weight_decay"], 0.0]
    assert all(p.ndim == 1 for p in optimizer.param_groups[0]["params"])
    assert optimizer.defaults["nesterov"] and optimizer.defaults["momentum"] == HYP["momentum"]
    adam = smart_optimizer(model, "Adam", 0.001, 0.9, 1e-5)
    assert adam.defaults["betas"] == (0.9, 0.999)


def test_early_stopping_the_yolov5_way():
    stopper, stop = EarlyStopping(patience=3), False
    final_epochs, stopped_at = [], None
    fits = [0.1, 0.3, 0.2, 0.25, 0.28, 0.29, 0.5]
    for epoch, value in enumerate(fits):
        final_epoch = epoch + 1 == len(fits) or stopper.possible_stop  # train.py: validate fully before a stop
        final_epochs.append(final_epoch)
        fi = fitness(np.array([0, 0, value, value]).reshape(1, -1))
        stop = stopper(epoch=epoch, fitness=fi)
        if stop:
            stopped_at = epoch
            break
    assert stopped_at == 4 and stopper.best_epoch == 1
    assert final_epochs == [False, False, False, False, True]  # epoch 3 (2 without improvement) flags epoch 4


def our_train_checkpoint(model: Model, path: Path) -> Path:
    """A checkpoint as our train.py's save_run writes it."""
    ema = ModelEMA(model)
    optimizer = smart_optimizer(model, "SGD", HYP["lr0"], HYP["momentum"], HYP["weight_decay"])
    ckpt = build_checkpoint(
        ema.ema,
        optimizer=optimizer,
        ema_updates=ema.updates,
        epoch=4,
        best_fitness=0.3,
        opt={"epochs": 5, "save_dir": str(path.parent)},
        hyp=HYP,
    )
    ckpt["train_model"] = model.state_dict()
    save_checkpoint(ckpt, path)
    return path


@pytest.mark.parametrize(
    "call",
    [
        lambda f, s: strip_optimizer(f),  # train.py: for f in last, best: strip_optimizer(f)
        lambda f, s: strip_optimizer(f, s),
        lambda f, s: strip_optimizer(f=f, s=s),
        lambda f, s: strip_optimizer(f=str(f), s=""),  # '' keeps f
    ],
)
def test_strip_optimizer_on_our_train_checkpoint(tmp_path, model, call):
    best = our_train_checkpoint(model, tmp_path / "best.pt")
    written = Path(call(best, tmp_path / "small.pt"))
    stripped = load_checkpoint(written)  # still loads without unpickling code
    assert stripped["optimizer"] is None and stripped["epoch"] == -1 and "train_model" not in stripped
    assert all(v.dtype in (torch.float16, torch.int64) for v in stripped["model"].values())
    assert written.stat().st_size < (tmp_path / "best.pt").stat().st_size or written == best
    fresh = Model(stripped["model_cfg"])
    fresh.load_state_dict(stripped["model"])  # the weights it holds rebuild the model


def test_strip_optimizer_with_no_arguments_strips_best_pt_here(tmp_path, model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    our_train_checkpoint(model, tmp_path / "best.pt")
    assert strip_optimizer() == Path("best.pt") and load_checkpoint("best.pt")["epoch"] == -1


def test_strip_optimizer_on_yolov5_layout_holding_our_model(tmp_path, model):
    # YOLOv5's train.py saves the modules themselves, in fp16: this is what it writes when it trains our Model
    ema = copy.deepcopy(model).half()
    ckpt = {"epoch": 4, "best_fitness": np.array([0.3]), "model": None, "ema": ema, "updates": 12}
    ckpt.update(optimizer={"state": {}, "param_groups": []}, opt={}, git=None, date="2024-01-01")
    torch.save(ckpt, tmp_path / "last.pt")
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint(tmp_path / "last.pt")  # not a plain checkpoint: load_checkpoint still refuses it
    strip_optimizer(tmp_path / "last.pt", tmp_path / "final.pt")
    stripped = torch.load(tmp_path / "final.pt", weights_only=False)
    assert isinstance(stripped["model"], Model) and stripped["epoch"] == -1  # the EMA became the model
    assert all(stripped[k] is None for k in ("optimizer", "best_fitness", "ema", "updates"))
    assert all(p.dtype == torch.float16 and not p.requires_grad for p in stripped["model"].parameters())
    for key, value in ema.state_dict().items():
        assert torch.equal(stripped["model"].state_dict()[key], value)


class Stranger(torch.nn.Module):
    """A module class from outside ddp_utils and torch: unpickling it could run anything."""


def test_strip_optimizer_refuses_foreign_classes(tmp_path):
    torch.save({"model": Stranger(), "epoch": 1}, tmp_path / "foreign.pt")
    with pytest.raises(UnsafeCheckpointError, match="Stranger.*not a ddp_utils or torch.nn module"):
        strip_optimizer(tmp_path / "foreign.pt")
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        strip_optimizer(tmp_path / "missing.pt")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_model_info_takes_verbose_second_as_yolov5(model, caplog):
    """utils/torch_utils.py: ``model_info(model, verbose=False, imgsz=640)``; a True second argument is verbose."""
    import logging

    from ddp_utils.profiling import model_info

    with caplog.at_level(logging.INFO, logger="ddp_utils"):
        info = model_info(model, True)
    assert "model.0.conv.weight" in caplog.text  # the per-parameter table
    assert info["summary"].endswith("GFLOPs")  # counted at 640, YOLOv5's default: no " at HxW"
    assert info["gflops"] == pytest.approx(model_info(model, False, 640)["gflops"])


def test_non_max_suppression_takes_yolov5s_arguments_in_its_order():
    """utils/general.py: (prediction, conf_thres, iou_thres, classes, agnostic, multi_label, labels, max_det, nm)."""
    from ddp_utils.yolo import non_max_suppression

    pred = torch.tensor([[[50.0, 50, 20, 20, 0.9, 0.9, 0.1], [10, 10, 4, 4, 0.05, 1, 0]]])
    known = torch.tensor([[1.0, 100, 100, 10, 10]])  # val.py --save-hybrid: a label joins as a sure detection
    (out,) = non_max_suppression(pred, 0.25, 0.45, None, False, False, [known], 300)
    assert out[:, 4].tolist() == pytest.approx([1.0, 0.81]) and out[:, 5].tolist() == [1.0, 0.0]
    assert out[0, :4].tolist() == [95.0, 95.0, 105.0, 105.0]
    (only_dets,) = non_max_suppression(pred, 0.25, 0.45, None, False, False, (), 300, 0)
    assert len(only_dets) == 1
    with pytest.raises(ValueError, match="nm=32"):
        non_max_suppression(pred, nm=32)


def test_letterbox_takes_yolov5s_keywords():
    """utils/augmentations.py: ``letterbox(im, new_shape, color, auto, scaleFill, scaleup, stride)``."""
    from ddp_utils.data import letterbox

    img = np.zeros((100, 50, 3), np.uint8)
    out, ratio, pad = letterbox(im=img, new_shape=(64, 64), auto=False, scaleFill=True)
    assert out.shape == (64, 64, 3) and ratio == (64 / 50, 64 / 100) and pad == (0.0, 0.0)
    assert letterbox(img, 64, (114, 114, 114), False, False, True, 32)[0].shape == (64, 64, 3)


def test_small_helpers_take_yolov5s_call_forms(tmp_path):
    """utils/torch_utils.py ``select_device(device, batch_size, newline)``, ``time_sync``; utils/general.py
    ``yaml_save(file, data)``; utils/loss.py ``smooth_BCE(eps=0.1)``, ``FocalLoss(loss_fcn, gamma, alpha)``."""
    import ddp_utils as du
    from ddp_utils.run import yaml_save
    from ddp_utils.yolo import FocalLoss, smooth_BCE

    assert du.select_device("cpu", batch_size=0, newline=False) == torch.device("cpu")
    t0 = du.time_sync()
    assert du.time_sync() >= t0
    assert yaml_save(file=tmp_path / "opt.yaml", data={"epochs": 3}).read_text() == "epochs: 3\n"
    assert smooth_BCE() == (0.95, 0.05)  # YOLOv5's default eps is 0.1
    focal = FocalLoss(loss_fcn=torch.nn.BCEWithLogitsLoss(), gamma=1.5, alpha=0.25)
    assert focal.loss_fcn.reduction == "none" and focal.reduction == "mean"
    assert float(focal(torch.zeros(4), torch.ones(4))) > 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_set_logging_by_name_configures_the_host_logger():
    """utils/general.py v6.1+: ``set_logging(name, verbose)`` sets up the named logger the script uses."""
    import subprocess
    import sys

    code = (
        "import ddp_utils as du\n"
        "LOGGER = du.set_logging('yolov5')\n"
        "LOGGER.info('host line')\n"
        "du.LOGGER.info('library line')\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "LOCAL_RANK", "SLURM_PROCID")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("host line") == 1 and proc.stderr.count("library line") == 1
