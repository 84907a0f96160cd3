"""What a user meets around train.py: errors under torchrun, logs in a file, YOLOv5's habits, file modes.

Real train.py processes on the CPU (real torchrun with gloo where it says so), bounded by timeouts.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from .multiproc import free_port
from .test_train import describe, run, torchrun, train_env


def _errors_case(case: str, tmp_path: Path) -> tuple[list[str], str]:
    if case == "batch size not a multiple":
        return ["--batch-size", "3"], "--batch-size 3 does not divide by WORLD_SIZE=2"
    missing = tmp_path / "missing.yaml"
    return ["--data", str(missing)], str(missing)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", ["batch size not a multiple", "missing data yaml"])
def test_user_error_under_torchrun_is_one_line_and_named_in_torchruns_report(case, tmp_path):
    args, named = _errors_case(case, tmp_path)
    project = tmp_path / "runs"
    cmd = torchrun(2, "train.py", "--device", "cpu", "--epochs", "1", "--project", str(project), *args,
                   port=free_port())  # fmt: skip
    result = run(cmd, train_env(), 220)
    assert result.returncode == 1, describe([result])  # torchrun's own code when a worker fails
    output = result.stdout + result.stderr
    errors = [line for line in output.splitlines() if "train.py: error:" in line]
    # one line from the workers (the node's first process), then torchrun's report naming the cause per rank
    printed = [line for line in errors if not line.lstrip().startswith("traceback :")]
    assert len(printed) == 1 and named in printed[0], describe([result])
    report = output[output.index("Root Cause") :]
    assert re.search(r"exitcode\s*: 2", report), describe([result])
    assert "To enable traceback see" not in report.split("Root Cause")[-1], describe([result])
    assert re.search(rf"traceback\s*: train\.py: error: .*{re.escape(named)}", report), describe([result])
    assert 'train.py", line' not in output, describe([result])  # no worker printed a traceback
    assert not project.exists() or not any(project.iterdir())


@pytest.mark.timeout(120)
def test_user_error_in_a_single_process_is_one_line_exit_2(tmp_path):
    cmd = [sys.executable, "train.py", "--device", "cpu", "--data", str(tmp_path / "missing.yaml")]
    result = run(cmd, train_env(), 100)
    assert result.returncode == 2, describe([result])
    errors = [line for line in result.stderr.splitlines() if "train.py: error:" in line]
    assert len(errors) == 1 and "missing.yaml: no such file" in errors[0], describe([result])
    assert "Traceback" not in result.stderr, describe([result])
