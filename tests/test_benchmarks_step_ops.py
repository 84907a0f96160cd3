"""benchmarks/speed/step_ops.py: the op budget per part of the step, run on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "speed" / "step_ops.py"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_step_ops_counts_every_part_and_finds_no_host_wait():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(SCRIPT), "--model", "yolov5n.yaml", "--repeats", "1"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=380)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1].removeprefix("RESULT "))
    assert result["ddp_utils"] == str(REPO) and result["fused_optimizer"] is True
    assert set(result["ops"]) == {"model forward", "loss forward", "backward", "optimizer + clip", "EMA"}
    assert all(n > 0 for n in result["ops"].values()) and result["ops"]["EMA"] == 3
    assert result["ops"]["loss forward"] <= 200 and result["outside_share"] <= 0.4
    assert all(not waits for waits in result["waits"].values()), result["waits"]
    assert set(result["host_only_ms"]) == {"optimizer + clip", "EMA"}
    assert "| whole step |" in done.stdout
