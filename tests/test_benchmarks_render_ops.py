"""benchmarks/render_ops.py: the device path's kernels per batch and its host waits, counted on the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_render_ops_counts_the_kernels_of_a_batch_and_finds_no_host_wait(capsys):
    spec = importlib.util.spec_from_file_location("render_ops", REPO / "benchmarks" / "render_ops.py")
    render_ops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render_ops)
    result = render_ops.main(["--imgsz", "64", "--batch", "4"])
    assert result["host_waits"] == 0 and result["kernels"] > 0 and result["images_decoded"] >= 4
    assert "RESULT " in capsys.readouterr().out
