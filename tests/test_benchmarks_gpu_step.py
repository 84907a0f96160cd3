"""benchmarks/gpu/gpu_step.py: its train.py log parser, and a --quick run end to end on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .benchmark_scripts import load_benchmark

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu" / "gpu_step.py"


def load_script():
    return load_benchmark("gpu_step")


def test_train_log_parser_reads_train_py_epoch_lines_and_ignores_the_rest():
    parse = load_script().parse_train_log
    log = "\n".join(
        [
            "epoch 1/3: loss 0.1 0.2 0.3, P 0.0 R 0.0 mAP@0.5 0.000 mAP@0.5:0.95 0.000, 100.0 img/s, data wait 20.0%",
            "1/3 mem 1.2G box 0.1 obj 0.2 cls 0.3",  # a progress bar
            "\repoch 2/3: loss 0.1 0.2 0.3, P 0.1 R 0.1 mAP@0.5 0.1 mAP@0.5:0.95 0.05, 812.5 img/s, data wait 0.2%",
            "resuming from epoch 7",  # no figures: not an epoch record
        ]
    )
    assert parse(log) == [
        {"epoch": 1, "img_s": 100.0, "data_wait_share": 0.2},
        {"epoch": 2, "img_s": 812.5, "data_wait_share": 0.002},
    ]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_without_cuda_it_says_so_and_measures_every_mode_at_quick_sizes():
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}  # no GPU, whatever the host has
    # the default sizes (yolov5s, 640 px, batch 64) would take 20 GB on a CPU: it must fall back to --quick
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, cwd=REPO, timeout=570)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("gpu_step: no CUDA device here") and "--quick sizes" in lines[0]
    figures = json.loads(lines[-1].removeprefix("RESULT "))
    assert figures["device"] == "cpu" and figures["quick"] is True
    assert "yolov5n.yaml 32px batch 2" in done.stdout
    assert figures["model_img_s"] > 0 and figures["step_img_s"] > 0 and figures["loader_img_s"] > 0
    assert set(figures["step_parts_ms"]) == {"forward", "loss", "backward", "optimizer", "ema"}
    assert 0 < figures["outside_model_share"] < 1
    for key in ("loop", "ddp"):  # train_one_epoch in this process, and under torchrun (DDP, gloo)
        assert "error" not in figures[key], figures[key]
        assert figures[key]["img_s"] > 0 and 0 <= figures[key]["data_wait_share"] <= 1
        assert len(figures[key]["per_epoch"]) == figures[key]["epochs"] >= 2
    assert figures["ddp"]["backend"] == "gloo"
    assert "| (5) the same under torchrun, DDP |" in done.stdout
