"""benchmarks/faults/preemption.py runs, and what it measures holds: a SIGTERM anywhere redoes no step."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def bench(*args: str, timeout: float) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(REPO / "benchmarks" / "faults" / "preemption.py"), *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_save_is_measured_in_and_out_of_the_step():
    out = bench("--parts", "save", "--models", "yolov5n.yaml", "--repeats", "1", timeout=180)
    cells = r"(\d+) MiB \| (\d+) ms \| (\d+) ms \| ([0-9.]+) \| (\d+) ms"
    row = re.search(rf"^\| yolov5n.yaml \| 1.9 M \| {cells} \|$", out, re.M)
    assert row, out
    assert int(row.group(1)) > 10 and float(row.group(4)) > 0


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_sigterm_at_a_random_step_redoes_no_step():
    out = bench("--parts", "sigterm", "--trials", "1", "--seed", "1", timeout=380)
    stopped = r"(epoch \d, batch \d/8|epoch \d)"
    row = re.search(rf"^\| 0 \| epoch (\d), step \d/8 \| {stopped} \| (\d+) \| (-?\d+) \| (\d) \|$", out, re.M)
    assert row, out
    assert row.group(3) == "24" and row.group(4) == "0", out  # both parts together train each step once
