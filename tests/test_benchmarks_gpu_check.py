"""benchmarks/gpu/gpu_check.py: a part that fails is a row saying why and the table comes anyway; --cpu-smoke runs
every part tiny on the CPU, so the check cannot rot between the GPU hosts it waits for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .benchmark_scripts import load_benchmark

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu" / "gpu_check.py"


def load_script():
    return load_benchmark("gpu_check")


def test_a_failing_part_is_a_row_with_its_reason_and_the_table_is_printed_anyway():
    check = load_script()

    def broken():
        raise check.PartFailed("exit 2: train.py: error: unrecognized arguments: --no-such-option")

    rows = [
        check.measure("ours", lambda: check.epoch_figures([9.0, 3.0, 2.0, 4.0], 25.0, [0.5, 0.2, 0.1, 0.3])),
        check.measure("augment", broken),
        check.measure("buggy", lambda: 1 / 0),
        check.measure("YOLOv5", lambda: (_ for _ in ()).throw(check.PartFailed("skipped: no --yolov5 DIR"))),
    ]
    assert rows[0][1]["steady_epoch_s"] == 3.0 and rows[0][1]["first_epoch_s"] == 9.0
    assert rows[0][1]["data_wait"] == pytest.approx(0.2)
    assert rows[1][1] == "failed: exit 2: train.py: error: unrecognized arguments: --no-such-option"
    assert rows[2][1] == "failed: ZeroDivisionError: division by zero" and rows[3][1] == "skipped: no --yolov5 DIR"
    lines = check.table(rows, images=960).splitlines()
    assert lines[2].startswith("| ours | 3.0 s | 320.0 | 9.0 s | 25.0 s | 20% |")
    assert [line.split(" | ")[1] for line in lines[3:]] == [rows[1][1], rows[2][1], rows[3][1]]


def test_a_child_past_its_timeout_is_killed_with_its_workers_and_named(tmp_path):
    check = load_script()
    started, pid_file = time.monotonic(), tmp_path / "worker.pid"
    worker = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {worker!r}])"
    with pytest.raises(check.PartFailed, match=r"timed out after 2 s"):
        check.run_child([sys.executable, "-c", parent], 2, tmp_path / "sleep.log")
    assert time.monotonic() - started < 30
    pid = int(pid_file.read_text())
    for _ in range(100):  # the worker, a grandchild like the loader's, goes with its group
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"worker {pid} outlived the timeout")
    with pytest.raises(check.PartFailed, match=r"exit 3: bad input"):
        check.run_child([sys.executable, "-c", "import sys; print('bad input'); sys.exit(3)"], 30, tmp_path / "x.log")
    with pytest.raises(check.PartFailed, match="no time left"):
        check.run_child([sys.executable, "-c", "pass"], 0.5, tmp_path / "y.log")


def test_memory_is_flat_within_two_percent_from_the_second_epoch():
    check = load_script()
    assert check.spread([100, 200, 201, 202]) == pytest.approx(0.01)  # the first epoch makes what lives on
    assert check.spread([None, None]) is None


@pytest.mark.slow
@pytest.mark.timeout(1700)
def test_cpu_smoke_runs_every_part_and_prints_one_table_and_one_json_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, str(SCRIPT), "--cpu-smoke", "--dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=1650)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert any(line.startswith("| part | steady epoch |") for line in lines)
    result = json.loads(lines[-1].removeprefix("GPU_CHECK "))
    rows = result["rows"]
    check = load_script()
    assert set(rows) == {name for name, _ in check.CONFIGS} | {
        "YOLOv5 v7.0 train.py", "memory", "cuda_tests", "gpu_step", "default_job"
    }  # fmt: skip
    default = rows[check.CONFIGS[0][0]]
    assert default["steady_epoch_s"] > 0 and default["first_epoch_s"] > 0 and default["run_s"] > 0, default
    for name, _ in check.CONFIGS[1:4]:  # the cuDNN modes run on the CPU too (they change nothing there)
        assert "failed" not in rows[name], rows[name]
    assert rows["YOLOv5 v7.0 train.py"] == {"skipped": "skipped: no --yolov5 DIR"}
    memory = rows["memory"]
    assert len(memory["allocated"]) == 3 and memory["flat"] is True, memory
    assert memory["val_s_fp32"] > 0 and memory["nms_s"] > 0 and memory["val_images"] == 4
    assert rows["cuda_tests"]["counts"]["collected"] > 0, rows["cuda_tests"]  # the CPU collects them, runs none
    assert rows["gpu_step"]["model_img_s"] > 0 and rows["gpu_step"]["loop_img_s"] > 0
    assert 0 <= rows["default_job"]["map"] <= rows["default_job"]["map50"] <= 1
