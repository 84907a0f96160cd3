"""benchmarks/gpu_step.py: its train.py log parser, and a --quick run end to end on CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_step.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def test_quick_run_on_cpu_measures_all_four():
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}  # --quick means CPU
    # about 30 s of CPU on 2 cores (two Python start-ups, two tiny trainings); the bound leaves room for load
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, env=env, cwd=REPO, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1].removeprefix("RESULT "))
    assert figures["device"] == "cpu"
    assert figures["model_img_s"] > 0 and figures["step_img_s"] > 0 and figures["loader_img_s"] > 0
    assert set(figures["step_parts_ms"]) == {"forward", "loss", "backward", "optimizer", "ema"}
    assert 0 < figures["tail_share"] < 1
    train = figures["train"]
    assert "error" not in train, train
    assert [e["epoch"] for e in train["parsed"]] == [1, 2] and train["img_s"] > 0
    assert 0 <= train["data_wait_share"] <= 1 and figures["train_over_bound"] > 0
    assert "| (4) train.py, steady state |" in done.stdout
