"""python -m ddp_utils val end to end: real checkpoints, real processes, a tiny synthetic dataset, CPU only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import cv2
import pytest
import torch
import yaml

from ddp_utils.cli.val import coco_predictions, image_id
from ddp_utils.run import build_checkpoint, save_checkpoint
from ddp_utils.yolo import Model
from ddp_utils.yolo.metrics import ImageRecord

from ..multiproc import REPO_ROOT, collect, free_port, launcher_env
from ..yolo import yolov5_standins as v5
from ..yolo.test_foreign import save_yolov5

NAMES = ["circle", "square", "triangle", "star"]
N_VAL = 16  # two shards of 8: the same batches of 4 (so the same rect shapes) as one process
TIMEOUT = 240  # seconds for one command; a hang fails the test instead of stalling CI


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A data yaml whose generator makes 16 small val images on first use, and an untrained 4-class checkpoint."""
    root = tmp_path_factory.mktemp("val")
    data = root / "tiny.yaml"
    data.write_text(
        f"path: {root / 'tiny'}\ntrain: images/train\nval: images/val\nnames: {dict(enumerate(NAMES))}\n"
        f"n_train: 2\nn_val: {N_VAL}\nsize: [96, 128]\nseed: 0\nmax_objects: 3\n"
        "download: ddp_utils.data.synthetic:generate\n"
    )
    torch.manual_seed(0)
    weights = root / "untrained.pt"
    save_checkpoint(build_checkpoint(Model("yolov5n.yaml", nc=len(NAMES))), weights)
    return {"root": root, "data": data, "weights": weights}


def val_args(setup: dict[str, Path], *extra: str, weights: Path | None = None) -> list[str]:
    return [
        "-m", "ddp_utils", "val", "--weights", str(weights or setup["weights"]), "--data", str(setup["data"]),
        "--imgsz", "96", "--device", "cpu", "--workers", "0", "--project", str(setup["root"] / "runs"), *extra,
    ]  # fmt: skip


def run(cmd: list[str], timeout: float = TIMEOUT):
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    (result,) = collect([proc], time.monotonic(), timeout, " ".join(cmd[:8]))
    return result


def run_val(setup: dict[str, Path], *extra: str, weights: Path | None = None):
    return run([sys.executable, *val_args(setup, *extra, weights=weights)])


def run_val_torchrun(setup: dict[str, Path], nproc: int, *extra: str):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                "--master_addr", "127.0.0.1", "--master_port", str(free_port())]  # fmt: skip
    return run([*launcher, *val_args(setup, *extra)])


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The per-class table's rows by class name (``all`` too), each the row's columns after the name."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["Class", "Images", "Instances"])
    rows = {}
    for line in lines[start + 1 :]:
        if line.startswith("Speed:"):
            break
        name, *values = line.split()
        rows[name] = values
    return rows


def val_labels(root: Path) -> dict[int, list[int]]:
    """Each val image's label classes, by image id."""
    files = sorted((root / "tiny" / "labels" / "val").glob("*.txt"))
    return {int(f.stem): [int(line.split()[0]) for line in f.read_text().split("\n") if line.strip()] for f in files}


def check_predictions(file: Path, root: Path) -> list[dict]:
    """predictions.json is COCO's results format, one entry per box, inside its original image."""
    predictions = json.loads(file.read_text())
    assert predictions, "no detections at conf 0.001 from an untrained model: the json should not be empty"
    sizes = {
        int(p.stem): cv2.imread(str(p)).shape[:2] for p in (root / "tiny" / "images" / "val").glob("*.jpg")
    }  # fmt: skip
    assert len(sizes) == N_VAL
    for entry in predictions:
        assert set(entry) == {"image_id", "category_id", "bbox", "score"}
        assert isinstance(entry["image_id"], int) and entry["image_id"] in sizes  # "000003.jpg" -> 3, as YOLOv5
        assert entry["category_id"] in range(len(NAMES))
        assert 0.001 <= entry["score"] <= 1
        x, y, w, h = entry["bbox"]
        height, width = sizes[entry["image_id"]]
        assert min(x, y, w, h) >= 0, entry
        assert x + w <= width + 1e-3 and y + h <= height + 1e-3, (entry, width, height)
    return predictions


@pytest.fixture(scope="module")
def single(setup: dict[str, Path]):
    result = run_val(setup, "--batch-size", "4", "--save-json", "--name", "single")
    assert result.returncode == 0, result.stderr
    return result


def test_prints_yolov5s_table_and_speed_line(single, setup: dict[str, Path]) -> None:
    rows = table_rows(single.stdout)
    labels = val_labels(setup["root"])
    instances = Counter(c for classes in labels.values() for c in classes)
    assert rows["all"][:2] == [str(N_VAL), str(sum(instances.values()))]
    assert set(rows) == {"all", *(NAMES[c] for c in instances)}  # a row per labelled class (4 classes > 1)
    for cls, count in instances.items():
        images_with_class = sum(cls in classes for classes in labels.values())
        assert rows[NAMES[cls]][:2] == [str(images_with_class), str(count)]
        assert all(0 <= float(v) <= 1 for v in rows[NAMES[cls]][2:])
    speed = re.search(r"^Speed: ([\d.]+)ms pre-process, ([\d.]+)ms inference, ([\d.]+)ms NMS per image at shape "
                      r"\(4, 3, 96, 96\)$", single.stdout, re.M)  # fmt: skip
    assert speed and float(speed[2]) > 0, single.stdout
    assert "Traceback" not in single.stderr


def test_writes_coco_predictions_for_every_image(single, setup: dict[str, Path]) -> None:
    predictions = check_predictions(setup["root"] / "runs" / "single" / "predictions.json", setup["root"])
    assert {p["image_id"] for p in predictions} <= set(val_labels(setup["root"]))
    assert max(Counter(p["image_id"] for p in predictions).values()) <= 300  # --max-det
    assert f"Results saved to {setup['root'] / 'runs' / 'single'}" in single.stdout


@pytest.mark.slow
@pytest.mark.multiprocess
def test_torchrun_two_processes_gather_the_same_predictions_on_rank_0(single, setup: dict[str, Path]) -> None:
    # --batch-size is the total: 8 over 2 processes gives each the single run's batches of 4
    result = run_val_torchrun(setup, 2, "--batch-size", "8", "--save-json", "--name", "ddp")
    assert result.returncode == 0, result.stdout + result.stderr
    assert table_rows(result.stdout) == table_rows(single.stdout)
    assert result.stdout.count("Class     Images") == 1  # rank 0 alone prints
    ddp = check_predictions(setup["root"] / "runs" / "ddp" / "predictions.json", setup["root"])
    one = json.loads((setup["root"] / "runs" / "single" / "predictions.json").read_text())
    assert len(ddp) == len(one)
    assert Counter(p["image_id"] for p in ddp) == Counter(p["image_id"] for p in one)  # each image once
    assert not (setup["root"] / "runs" / "ddp2").exists()  # one directory, written by rank 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_yolov5_checkpoint_is_scored_with_its_class_names(setup: dict[str, Path], tmp_path: Path) -> None:
    cfg = {**yaml.safe_load((REPO_ROOT / "configs" / "models" / "yolov5n.yaml").read_text()), "nc": len(NAMES)}
    weights = save_yolov5(v5.yolov5_checkpoint(v5.build(cfg)), tmp_path / "yolov5n.pt")
    result = run_val(setup, "--batch-size", "4", "--verbose", weights=weights)
    assert result.returncode == 0, result.stderr
    assert {"class0", "class1"} <= set(table_rows(result.stdout))  # the checkpoint's names, as YOLOv5's val


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_class_prints_the_class_row_only_with_verbose(setup: dict[str, Path], tmp_path: Path) -> None:
    weights = tmp_path / "one.pt"
    save_checkpoint(build_checkpoint(Model("yolov5n.yaml", nc=1)), weights)
    quiet = run_val(setup, "--batch-size", "4", "--single-cls", weights=weights)
    assert quiet.returncode == 0, quiet.stderr
    assert set(table_rows(quiet.stdout)) == {"all"}
    verbose = run_val(setup, "--batch-size", "4", "--single-cls", "--verbose", weights=weights)
    assert set(table_rows(verbose.stdout)) == {"all", "item"}
    assert table_rows(verbose.stdout)["all"][:2] == table_rows(verbose.stdout)["item"][:2] == [str(N_VAL), str(
        sum(len(c) for c in val_labels(setup["root"]).values()))]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"weights": "missing.pt"}, "missing.pt: no such file"),
        ({"data": "missing.yaml"}, "missing.yaml"),
        ({"nc": 2}, "has 2 classes but --data"),
        ({"garbage": True}, "not a torch checkpoint"),
        ({"args": ("--task", "test")}, "has no 'test' split"),
        ({"args": ("--device", "99")}, "device '99' requested"),  # no such GPU, on any host
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(change: dict, message: str, setup: dict[str, Path], tmp_path) -> None:
    weights = setup["weights"]
    if "weights" in change:
        weights = tmp_path / change["weights"]
    if "nc" in change:
        weights = tmp_path / "nc2.pt"
        save_checkpoint(build_checkpoint(Model("yolov5n.yaml", nc=change["nc"])), weights)
    if "garbage" in change:
        weights = tmp_path / "garbage.pt"
        weights.write_text("hi\n")
    args = val_args(setup, "--project", str(tmp_path / "runs"), *change.get("args", ()), weights=weights)
    if "data" in change:
        args[args.index("--data") + 1] = str(tmp_path / change["data"])
    result = run([sys.executable, *args])
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("python -m ddp_utils val: error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()  # nothing left behind


def test_image_id_and_json_entries_as_yolov5_writes_them() -> None:
    import numpy as np

    assert image_id("/data/coco/images/val2017/000000000139.jpg") == 139
    assert image_id("val/IMG_0001.jpg") == "IMG_0001"
    record = ImageRecord("a/12.jpg", 100, 200, predictions=np.array([[1.23456, 2, 11.5, 22, 0.1234567, 3]]))
    assert coco_predictions([record]) == [{"image_id": 12, "category_id": 3, "bbox": [1.235, 2.0, 10.265, 20.0],
                                           "score": 0.12346}]  # fmt: skip
    assert coco_predictions([record], class_map=[1, 2, 3, 4])[0]["category_id"] == 4
