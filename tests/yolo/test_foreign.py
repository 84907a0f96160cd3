"""YOLOv5 checkpoints read without running them: the pickle layout, the mapping, the refusals, the CLI.

The checkpoints are written here by stand-in classes at YOLOv5's module paths (tests/yolo/
yolov5_standins.py), which are removed from sys.modules before reading: the reader needs none of them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from copy import deepcopy
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from ddp_utils.run import CHECKPOINT_KEYS, build_checkpoint, check_plain, load_checkpoint, save_checkpoint
from ddp_utils.run.checkpoint import convert_yolov5_checkpoint, foreign_resume_message, load_pretrained
from ddp_utils.yolo import Model
from ddp_utils.yolo.foreign import (
    ForeignCheckpointError,
    UltralyticsCheckpointError,
    UnsafePickleError,
    read_yolov5_checkpoint,
    yolov5_model,
)

from ..multiproc import REPO_ROOT, launcher_env
from . import yolov5_standins as v5

CONFIGS = REPO_ROOT / "configs" / "models"
# YOLOv5 v5.0's yolov5s layout: a Focus stem and SPP, from the days of models.yolo.Model
V50_YAML = {
    "nc": 3,
    "depth_multiple": 0.33,
    "width_multiple": 0.25,
    "anchors": [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]],
    "backbone": [
        [-1, 1, "Focus", [64, 3]],
        [-1, 1, "Conv", [128, 3, 2]],
        [-1, 3, "C3", [128]],
        [-1, 1, "Conv", [256, 3, 2]],
        [-1, 9, "C3", [256]],
        [-1, 1, "Conv", [512, 3, 2]],
        [-1, 9, "C3", [512]],
        [-1, 1, "Conv", [1024, 3, 2]],
        [-1, 1, "SPP", [1024, [5, 9, 13]]],
        [-1, 3, "C3", [1024, False]],
    ],
    "head": [
        [-1, 1, "Conv", [512, 1, 1]],
        [-1, 1, "nn.Upsample", ["None", 2, "nearest"]],
        [[-1, 6], 1, "Concat", [1]],
        [-1, 3, "C3", [512, False]],
        [-1, 1, "Conv", [256, 1, 1]],
        [-1, 1, "nn.Upsample", ["None", 2, "nearest"]],
        [[-1, 4], 1, "Concat", [1]],
        [-1, 3, "C3", [256, False]],
        [-1, 1, "Conv", [256, 3, 2]],
        [[-1, 14], 1, "Concat", [1]],
        [-1, 3, "C3", [512, False]],
        [-1, 1, "Conv", [512, 3, 2]],
        [[-1, 10], 1, "Concat", [1]],
        [-1, 3, "C3", [1024, False]],
        [[17, 20, 23], 1, "Detect", ["nc", "anchors"]],
    ],
}


def save_yolov5(ckpt: dict, path: Path, protocol: int = 2, prefix: str = "models") -> Path:
    """torch.save with the stand-ins at YOLOv5's paths, then prove they are gone."""
    with v5.yolov5_modules(prefix):
        torch.save(ckpt, path, pickle_protocol=protocol)
    top = prefix.split(".")[0]
    assert not any(name == top or name.startswith(f"{top}.") for name in sys.modules)
    return path


def outputs(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    with torch.no_grad():
        return model.eval()(x.clone())


def assert_same_outputs(reference: nn.Module, ours: nn.Module) -> None:
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    (z_ref, raw_ref), (z_ours, raw_ours) = outputs(reference, x), outputs(ours, x)
    assert z_ref.shape == z_ours.shape
    torch.testing.assert_close(z_ours, z_ref, rtol=1e-5, atol=1e-4)
    for a, b in zip(raw_ours, raw_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


@pytest.fixture(scope="module")
def v5n(tmp_path_factory: pytest.TempPathFactory) -> tuple[v5.DetectionModel, Path]:
    model = v5.build(yaml.safe_load((CONFIGS / "yolov5n.yaml").read_text()))
    path = save_yolov5(v5.yolov5_checkpoint(model), tmp_path_factory.mktemp("v5n") / "yolov5n.pt")
    return model, path


# torch.save's default pickle protocol is 2; 1 goes through copyreg._reconstructor, 4 through NEWOBJ_EX/memo frames
@pytest.mark.parametrize(("cfg", "protocol"), [("yolov5n.yaml", 2), ("yolov5s.yaml", 2), ("yolov5n.yaml", 1),
                                               ("yolov5n.yaml", 4)])  # fmt: skip
def test_same_outputs_as_yolov5s_model_on_the_same_weights(cfg: str, protocol: int, tmp_path: Path) -> None:
    standin = v5.build(yaml.safe_load((CONFIGS / cfg).read_text()))
    path = save_yolov5(v5.yolov5_checkpoint(standin), tmp_path / "w.pt", protocol)
    read = read_yolov5_checkpoint(path)
    model, report = yolov5_model(read, str(path))
    reference = deepcopy(standin).half().float()  # the weights as the file holds them
    expected = reference.state_dict()
    assert report == {"transferred": len(expected), "derived": []}
    got = model.state_dict()
    assert set(got) == set(expected) | {"model.24.stride"}
    for name, tensor in expected.items():
        assert got[name].dtype == (torch.float32 if tensor.is_floating_point() else tensor.dtype), name
        assert torch.equal(got[name], tensor.to(got[name].dtype)), name
    assert model.stride.tolist() == [8.0, 16.0, 32.0] == read["stride"]
    assert_same_outputs(reference, model)
    assert (read["class_path"], read["epoch"], read["nc"]) == ("models.yolo.DetectionModel", -1, 80)
    assert model.names[:2] == ["class0", "class1"] and read["opt"]["imgsz"] == 640


def test_pip_yolov5_package_paths_are_yolov5s_classes_too(v5n, tmp_path: Path) -> None:
    path = save_yolov5(v5.yolov5_checkpoint(v5n[0]), tmp_path / "pip.pt", prefix="yolov5.models")
    read = read_yolov5_checkpoint(path)
    assert read["class_path"] == "yolov5.models.yolo.DetectionModel"
    assert yolov5_model(read, str(path))[1]["transferred"] == len(v5n[0].state_dict())


def test_converted_file_loads_weights_only_and_gives_the_same_outputs(v5n, tmp_path: Path) -> None:
    standin, path = v5n
    dst = convert_yolov5_checkpoint(path, tmp_path / "ours.pt")
    ckpt = load_checkpoint(dst)  # weights_only=True
    assert set(CHECKPOINT_KEYS) <= set(ckpt) and ckpt["epoch"] == -1 and ckpt["optimizer"] is None
    assert ckpt["converted_from"] == str(path) and ckpt["names"][79] == "class79"
    model = Model(ckpt["model_cfg"])
    model.load_state_dict(ckpt["model"], strict=True)
    assert_same_outputs(deepcopy(standin).half().float(), model)
    assert convert_yolov5_checkpoint(path) == path.with_name("yolov5n-ddp.pt")


def test_load_pretrained_takes_either_kind_and_marks_the_foreign_one(v5n, tmp_path: Path) -> None:
    _, path = v5n
    foreign = load_pretrained(path)
    assert foreign["foreign"] == "yolov5" and set(CHECKPOINT_KEYS) <= set(foreign)
    check_plain(foreign)
    ours_path = tmp_path / "ours.pt"
    save_checkpoint(build_checkpoint(Model(foreign["model_cfg"]), epoch=3), ours_path)
    ours = load_pretrained(ours_path)
    assert "foreign" not in ours and ours["epoch"] == 3
    assert foreign_resume_message(path) == (
        f"{path} is a YOLOv5 checkpoint: resume is only for ddp_utils runs; fine-tune from it with --weights {path}"
    )
    with pytest.raises(ForeignCheckpointError, match="state dict, not a YOLOv5 model"):
        read_yolov5_checkpoint(ours_path)


def test_older_model_class_with_focus_spp_and_anchor_grid_buffer(tmp_path: Path) -> None:
    standin = v5.build(V50_YAML, legacy=True)
    ckpt = v5.yolov5_checkpoint(standin, epoch=10)
    # a mid-training last.pt of that era: EMA kept, options as a Namespace, fitness as a numpy array
    ckpt.update(ema=deepcopy(ckpt["model"]), opt=argparse.Namespace(epochs=30, hyp={"lr0": 0.01}))
    ckpt.update(best_fitness=np.array([0.25]), updates=1234)
    path = save_yolov5(ckpt, tmp_path / "last.pt")
    read = read_yolov5_checkpoint(path)
    assert read["class_path"] == "models.yolo.Model"
    assert read["module_classes"]["model.0"] == "models.common.Focus"
    assert read["opt"] == {"epochs": 30, "hyp": {"lr0": 0.01}} and read["best_fitness"] == 0.25
    model, report = yolov5_model(read, str(path))
    assert report["derived"] == ["model.24.anchor_grid"]
    assert report["transferred"] == len(standin.state_dict()) - 1
    assert_same_outputs(deepcopy(standin).half().float(), model)


@contextlib.contextmanager
def module_at(path: str, *classes: type) -> Iterator[None]:
    """Put classes at module ``path`` (and its parents) in sys.modules for one torch.save."""
    parts = path.split(".")
    modules = {n: types.ModuleType(n) for n in (".".join(parts[: i + 1]) for i in range(len(parts)))}
    for cls in classes:
        cls.__module__ = path
        setattr(modules[path], cls.__name__, cls)
    with v5.installed_modules(modules):
        yield


class DetectionModel(nn.Module):  # stands in for ultralytics.nn.tasks.DetectionModel
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Conv2d(3, 8, 3))
        self.yaml = {"nc": 80, "scale": "s"}


@pytest.fixture
def ultralytics_pt(tmp_path: Path) -> Path:
    path = tmp_path / "yolov5su.pt"
    with module_at("ultralytics.nn.tasks", DetectionModel):
        torch.save({"model": DetectionModel().half(), "train_args": {}, "version": "8.1.0"}, path)
    return path


def test_ultralytics_8_checkpoint_is_refused_with_its_reason(ultralytics_pt: Path) -> None:
    with pytest.raises(UltralyticsCheckpointError, match=r"Ultralytics 8 .*ultralytics\.nn\.tasks.*anchor-free"):
        read_yolov5_checkpoint(ultralytics_pt)


class Evil:
    def __init__(self, command: str, use_eval: bool = False) -> None:
        self.command, self.use_eval = command, use_eval

    def __reduce__(self) -> tuple:
        if self.use_eval:
            return eval, (f"__import__('os').system({self.command!r})",)
        return os.system, (self.command,)


@pytest.mark.parametrize("where", ["top", "inside_model", "eval"])
def test_malicious_pickle_is_refused_and_nothing_runs(where: str, v5n, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = Evil(f"touch {marker}", use_eval=where == "eval")
    if where == "inside_model":
        ckpt = v5.yolov5_checkpoint(v5n[0])
        ckpt["model"].evil = evil
        path = save_yolov5(ckpt, tmp_path / "evil.pt")
    else:
        path = tmp_path / "evil.pt"
        torch.save({"model": evil, "epoch": 0}, path)
    callee = "builtins.eval" if where == "eval" else f"{os.system.__module__}.system"
    with pytest.raises(UnsafePickleError, match=rf"calls {callee}\(\.\.\.\).*nothing was run"):
        read_yolov5_checkpoint(path)
    with pytest.raises(UnsafePickleError):
        load_pretrained(path)
    assert not marker.exists()


def test_unknown_layout_names_the_first_mismatch(v5n, tmp_path: Path) -> None:
    ckpt = v5.yolov5_checkpoint(v5n[0])
    ckpt["model"].yaml["width_multiple"] = 0.5  # the yaml no longer describes the weights
    path = save_yolov5(ckpt, tmp_path / "odd.pt")
    with pytest.raises(ForeignCheckpointError, match=r"unknown layout: model\.0\.conv\.weight is \(16, 3, 6, 6\)"):
        yolov5_model(read_yolov5_checkpoint(path), str(path))
    ckpt["model"].yaml["head"][0][2] = "C3TR"  # a block this detector does not have
    path = save_yolov5(ckpt, tmp_path / "c3tr.pt")
    with pytest.raises(ForeignCheckpointError, match="does not build.*unknown module 'C3TR'"):
        yolov5_model(read_yolov5_checkpoint(path), str(path))


def run_convert(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "ddp_utils", "convert", *args]
    return subprocess.run(cmd, cwd=REPO_ROOT, env=launcher_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cli_converts_and_says_one_line_for_each_bad_input(v5n, ultralytics_pt: Path, tmp_path: Path) -> None:
    _, path = v5n
    out = tmp_path / "out.pt"
    done = run_convert(str(path), str(out))
    assert done.returncode == 0 and f"converted {path} -> {out}" in done.stdout, done.stderr
    assert load_checkpoint(out)["epoch"] == -1
    (tmp_path / "text.pt").write_text("not a checkpoint\n")
    cases = {
        str(tmp_path / "missing.pt"): "does not exist",
        str(tmp_path / "text.pt"): "not a torch checkpoint",
        str(ultralytics_pt): "Ultralytics 8",
        str(out): "already a ddp_utils checkpoint",
    }
    for src, message in cases.items():
        failed = run_convert(src)
        lines = failed.stderr.strip().splitlines()
        assert failed.returncode == 2, (src, failed.stderr)
        assert len(lines) == 1 and message in lines[0], failed.stderr
        assert lines[0].startswith("python -m ddp_utils convert: error: "), failed.stderr


def test_forced_weights_only_load_is_named_not_taken_for_a_bad_file(v5n, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(ForeignCheckpointError, match="TORCH_FORCE_WEIGHTS_ONLY_LOAD is set; unset it"):
        read_yolov5_checkpoint(v5n[1])
