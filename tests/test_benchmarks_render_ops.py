"""benchmarks/speed/render_ops.py: the device path's launches, bytes and host waits per batch, counted on the CPU."""

from __future__ import annotations

import pytest

from .benchmark_scripts import load_benchmark


def test_render_ops_counts_a_batch_and_finds_no_host_wait(capsys):
    result = load_benchmark("render_ops").main(["--imgsz", "64", "--batch", "4", "--eager", "--mixups", "0.5"])
    (counted,) = result["results"]
    assert counted["host_waits"] == 0 and counted["launches"] > 0 and counted["sources"] >= 4
    assert counted["allocated_x"] > counted["decoded_x"] > 0
    assert "RESULT " in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_compiled_render_is_at_the_floor():
    # the floors, at a size the slow tier affords (the 640 px, batch 64 figures: docs/gpu.md)
    benchmark = load_benchmark("render_ops")
    compiled = benchmark.main(["--imgsz", "160", "--batch", "16", "--mixups", "0", "0.3"])
    assert compiled["compiled"] and compiled["images"] >= 4 * 16
    for counted in compiled["results"]:
        assert counted["launches"] <= benchmark.LAUNCH_GOAL and counted["allocated_x"] <= benchmark.BYTES_GOAL
        assert counted["host_waits"] == 0
    assert compiled["results"][1]["mixed"] > 0
    # the counter sees what the compiler saves: the same render uncompiled launches an op per operation
    eager = benchmark.main(["--imgsz", "160", "--batch", "16", "--mixups", "0.3", "--eager"])
    assert eager["results"][0]["launches"] > benchmark.LAUNCH_GOAL
