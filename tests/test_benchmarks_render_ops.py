"""benchmarks/speed/render_ops.py: the device path's kernels per batch and its host waits, counted on the CPU."""

from __future__ import annotations

from .benchmark_scripts import load_benchmark


def test_render_ops_counts_the_kernels_of_a_batch_and_finds_no_host_wait(capsys):
    result = load_benchmark("render_ops").main(["--imgsz", "64", "--batch", "4"])
    assert result["host_waits"] == 0 and result["kernels"] > 0 and result["images_decoded"] >= 4
    assert "RESULT " in capsys.readouterr().out
