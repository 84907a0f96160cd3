"""benchmarks/speed/device_start.py and loader_thread_wait.py: the device path's first step and last, and the
training thread's wait beside the loader thread, measured small (the figures themselves: docs/gpu.md)."""

from __future__ import annotations

import pytest

from .benchmark_scripts import load_benchmark


def test_a_stamped_run_gives_its_first_batch_its_exit_and_what_the_render_said():
    start = load_benchmark("device_start")
    lines = [
        (4.0, "train: images made on the device cpu (--augment-on device): decoded by libjpeg-turbo"),
        (4.1, "train: scanning labels 3/4 75% 0.0s"),  # a scan's progress is no batch
        (9.5, "1/1 mem - box 0.1210 obj 0.0288 cls 0.0442 inst 104 size 160 0/4 0% 0.1s"),
        (12.0, "1/1 mem - box 0.1210 obj 0.0288 cls 0.0442 inst 104 size 160 1/4 25% 2.6s 0.38 it/s"),
        (13.0, "device render: compiled kernels ready after 8.0 s (render_cl, resize; kept in /tmp/k)"),
        (20.0, "1 epoch done; results in runs/train/exp"),
    ]
    figures = start.run_figures(dict(lines=lines, exit_s=21.5, code=0), cache=None)
    assert figures["first_batch_s"] == 12.0 and figures["last_line_s"] == 20.0
    assert figures["exit_after_last_line_s"] == pytest.approx(1.5) and figures["compiled_ready_s"] == 13.0
    assert figures["device_render"] == ["compiled kernels ready after 8.0 s (render_cl, resize; kept in /tmp/k)"]
    assert figures["made_on"].startswith("images made on the device cpu") and figures["traceback"] is False
    lines.append((21.0, "Traceback (most recent call last):"))
    assert start.run_figures(dict(lines=lines, exit_s=22.0, code=0), cache=None)["traceback"] is True


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_runs_end_clean_cold_and_with_a_failing_compiler(tmp_path):
    start = load_benchmark("device_start")
    args = ["--parts", "runs", "--sets", "8", "--imgsz", "64", "--batch", "4", "--workers", "0", "--sides", "48", "64"]
    result = start.main([*args, "--modes", "workers", "device-cold", "device-nocxx", "--dir", str(tmp_path)])
    runs = {run["mode"]: run for run in result["runs"]}
    for mode, run in runs.items():
        assert run["code"] == 0 and run["traceback"] is False and run["first_batch_s"] > 0, (mode, run)
        assert run["exit_after_last_line_s"] is not None and run["compile_left"] == [], (mode, run)
    assert runs["workers"]["made_on"].startswith("images made on the loader workers")
    assert runs["device-cold"]["made_on"].startswith("images made on the device cpu")
    # the compile starts at the second batch and fails in seconds: one line where the run lasted that long
    said = runs["device-nocxx"]["device_render"]
    assert len(said) <= 1 and all("did not compile (InvalidCxxCompiler" in line for line in said), said


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_training_threads_wait_is_measured_beside_the_loader_thread():
    result = load_benchmark("loader_thread_wait").main(["--imgsz", "64", "--rounds", "1", "--steps", "2"])
    assert result["compiled"] and min(result[f"step_{k}s"] for k in ("alone_", "beside_", "beside_kernels_")) > 0
    assert result["loader_thread_cpu_s_per_batch"] > 0 and result["wait"] == result["wait_range"][0]
    assert result["interpreter_wait"] == pytest.approx(result["wait"] - result["kernels_alone_wait"])
