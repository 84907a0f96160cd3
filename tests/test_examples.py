"""The examples/ scripts run as written, offline on a CPU: one process and two under torchrun (gloo)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_utils import load_hyp
from ddp_utils.yolo import scale_loss_gains

from .multiproc import REPO_ROOT, collect, free_port, launcher_env

TIMEOUT = 300  # seconds; a hang fails the test instead of stalling CI
EPOCH_LINE = re.compile(
    r"^epoch (\d)/2: box ([\d.]+) obj ([\d.]+) cls ([\d.]+) \((\d) process\(es\) on cpu, 256 images\)$"
)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One datasets directory for both runs: the first generates shapes.yaml's images, the second reuses them."""
    return tmp_path_factory.mktemp("datasets")


def run_example(cmd: list[str], datasets: Path, **more_env: str):
    env = launcher_env({"DDP_UTILS_DATASETS_DIR": str(datasets), **more_env})
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    (result,) = collect([proc], time.monotonic(), TIMEOUT, " ".join(cmd))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result


def epoch_lines(stdout: str, processes: int) -> list[tuple[float, float, float]]:
    """The (box, obj, cls) losses each epoch line printed; exactly one line per epoch (rank 0 prints)."""
    matches = [EPOCH_LINE.match(line) for line in stdout.splitlines()]
    matches = [m for m in matches if m]
    assert [(int(m[1]), int(m[5])) for m in matches] == [(1, processes), (2, processes)], stdout
    return [(float(m[2]), float(m[3]), float(m[4])) for m in matches]


@pytest.mark.slow
def test_ddp_helpers_example_single_process(datasets: Path) -> None:
    result = run_example([sys.executable, "examples/ddp_helpers.py", "--device", "cpu"], datasets)
    losses = epoch_lines(result.stdout, 1)
    assert all(0 < value < 10 for epoch in losses for value in epoch)
    assert (datasets / "shapes" / "images" / "train").is_dir()  # generated offline, in the datasets directory


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ddp_helpers_example_under_torchrun_two_processes(datasets: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "examples/ddp_helpers.py", "--device", "cpu"]  # fmt: skip
    result = run_example(cmd, datasets)
    losses = epoch_lines(result.stdout, 2)
    assert all(0 < value < 10 for epoch in losses for value in epoch)
    assert "process group: gloo" in result.stderr and "world size 2" in result.stderr


# Runs the example as written, its ComputeLoss recording the gains it was given and each batch's loss items.
RECORDING_RUN = """
import json, os, runpy, sys

import ddp_utils.yolo

seen = {"gains": None, "items": []}


class RecordingLoss(ddp_utils.yolo.ComputeLoss):
    def __init__(self, model, hyp=None, *args, **kwargs):
        seen["gains"] = {key: hyp[key] for key in ("box", "obj", "cls")}
        super().__init__(model, hyp, *args, **kwargs)

    def __call__(self, preds, targets):
        loss, items = super().__call__(preds, targets)
        seen["items"].append(items.tolist())
        return loss, items


ddp_utils.yolo.ComputeLoss = RecordingLoss  # the example imports it from there
sys.argv = ["examples/ddp_helpers.py", *sys.argv[1:]]
runpy.run_path("examples/ddp_helpers.py", run_name="__main__")
with open(os.environ["RECORD_TO"], "w") as f:
    json.dump(seen, f)
"""


@pytest.mark.slow
def test_ddp_helpers_example_weighs_the_loss_as_train_py_and_averages_the_batches_run(datasets, tmp_path):
    """Copied into a project, the example trains with train.py's loss: the hyp's gains scaled to 3 levels, 4
    classes and 128 px (cls 0.5 -> 0.025, obj 1.0 -> 0.04), and the epoch's loss is the mean over the batches
    that ran (32 of one process's 256 images), not a sum over the ``--batches`` asked for (100)."""
    (tmp_path / "record.py").write_text(RECORDING_RUN)
    cmd = [sys.executable, str(tmp_path / "record.py"), "--device", "cpu", "--epochs", "1", "--batches", "100"]
    result = run_example(cmd, datasets, RECORD_TO=str(tmp_path / "seen.json"))
    seen = json.loads((tmp_path / "seen.json").read_text())
    expected = scale_loss_gains(load_hyp("hyp.shapes.yaml"), nl=3, nc=4, imgsz=128)  # what train.py computes
    assert seen["gains"] == {key: expected[key] for key in ("box", "obj", "cls")}
    assert seen["gains"]["cls"] == pytest.approx(0.025) and seen["gains"]["obj"] == pytest.approx(0.04)
    printed = re.search(r"^epoch 1/1: box ([\d.]+) obj ([\d.]+) cls ([\d.]+) \(1 process", result.stdout, re.M)
    assert printed, result.stdout
    assert len(seen["items"]) == 256 // 8  # every batch of the epoch ran: fewer than the 100 asked for
    means = [sum(batch[k] for batch in seen["items"]) / len(seen["items"]) for k in range(3)]
    assert [float(v) for v in printed.groups()] == pytest.approx(means, abs=1e-4)


def test_readme_shows_the_example_as_it_stands_in_the_file():
    readme = (REPO_ROOT / "README.md").read_text()
    code = (REPO_ROOT / "examples" / "ddp_helpers.py").read_text()
    body = code[code.index("from __future__ import annotations") :]
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert body in blocks, "README's helper example differs from examples/ddp_helpers.py: copy the file's code over"
