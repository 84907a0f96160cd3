"""benchmarks/faults.py runs, and its rows say what they should: a SIGTERM costs nothing and the job ends as the
uninterrupted one; a NaN loss is one skipped step and the job still finishes every epoch once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_the_fault_benchmark_runs_and_its_rows_hold(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(REPO / "benchmarks" / "faults.py"), "--faults", "sigterm", "nan", "--epochs", "2",
               "--dir", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=880)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sigterm, nan = json.loads((tmp_path / "faults.json").read_text())
    assert sigterm["finished"] and sigterm["steps_lost"] == 0 and sigterm["weights"] == "equal", sigterm
    assert "received SIGTERM" in sigterm["line"]
    assert nan["finished"] and nan["weights"] != "equal" and "1 optimizer step(s) skipped" in nan["line"], nan
    assert "| sigterm | " in done.stdout and "| nan | " in done.stdout
    assert sorted(p.name for p in (tmp_path / "logs").iterdir())[:2] == ["job00.log", "job01.log"]
