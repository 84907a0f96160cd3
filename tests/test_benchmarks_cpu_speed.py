"""benchmarks/speed/cpu_train_speed.py and loader_speed.py: how their tables read the runs (the runs are
measurements)."""

from __future__ import annotations

import pytest

from .benchmark_scripts import load_benchmark


def run(side: str, epoch_s: list[float], loss: float, cfg: str = "yolov5n.yaml") -> dict:
    return dict(cfg=cfg, side=side, epoch_s=epoch_s, losses=[[9.0, 9.0, 9.0], [loss, 0.0, 0.0]], load=[1.0, 2.0])


def test_the_steady_epoch_leaves_the_first_out():
    speed = load_benchmark("cpu_train_speed")
    assert speed.steady([30.0, 10.0, 12.0, 11.0]) == 11.0
    assert speed.steady([7.0]) == 7.0


def test_the_training_table_gives_yolov5s_steady_epoch_over_ours_per_model():
    speed = load_benchmark("cpu_train_speed")
    runs = [
        run("yolov5", [20.0, 12.0, 12.0], 0.5),
        run("off", [15.0, 10.0, 10.0], 0.25),
        run("compile", [90.0, 8.0, 8.0], 0.125),
        run("yolov5", [50.0, 40.0, 40.0], 0.5, cfg="yolov5s.yaml"),
        run("off", [44.0, 40.0, 40.0], 0.5, cfg="yolov5s.yaml"),
    ]
    rows = speed.table(runs).splitlines()[2:]
    assert len(rows) == 5
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    off, compiled, small_off = cells[1], cells[2], cells[4]
    assert off[:5] == ["yolov5n", "ours off", "15.00", "10.00", "1.20x"] and off[5] == "0.250000"
    assert compiled[2:5] == ["90.00", "8.00", "1.50x"]
    assert small_off[0] == "yolov5s" and small_off[4] == "1.00x"
    assert cells[0][4] == "" and cells[0][6] == "1.5"  # YOLOv5's own row has no ratio; load: mean of before and after


def test_a_batch_size_that_does_not_divide_the_images_is_refused(capsys):
    speed = load_benchmark("cpu_train_speed")
    with pytest.raises(SystemExit):
        speed.parse_args(["--n-train", "100", "--batch-size", "16"])
    assert "--n-train 100" in capsys.readouterr().err


def test_the_loader_table_gives_the_median_of_the_per_round_ratios():
    loader = load_benchmark("loader_speed")
    result = dict(
        case="tiny64", n=10, size=[48, 64], imgsz=64, load=[2.0, 1.0, 1.0],
        rates={"ours": [300.0, 200.0, 330.0], "yolov5": [100.0, 100.0, 110.0]}, ratios=[3.0, 2.0, 3.0],
        threads={"ours": {"cv2": 2}, "yolov5": {"cv2": 1}},
    )  # fmt: skip
    row = loader.table([result]).splitlines()[-1]
    assert "| 300 | 100 | 3.00x (2.00-3.00) | 2 / 1 | 2.0 |" in row
