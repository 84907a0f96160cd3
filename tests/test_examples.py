"""The examples/ scripts run as written, offline on a CPU: one process and two under torchrun (gloo)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .multiproc import REPO_ROOT, collect, free_port, launcher_env

TIMEOUT = 300  # seconds; a hang fails the test instead of stalling CI
EPOCH_LINE = re.compile(
    r"^epoch (\d)/2: box ([\d.]+) obj ([\d.]+) cls ([\d.]+) \((\d) process\(es\) on cpu, 256 images\)$"
)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One datasets directory for both runs: the first generates shapes.yaml's images, the second reuses them."""
    return tmp_path_factory.mktemp("datasets")


def run_example(cmd: list[str], datasets: Path):
    env = launcher_env({"DDP_UTILS_DATASETS_DIR": str(datasets)})
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


def test_readme_shows_the_example_as_it_stands_in_the_file():
    readme = (REPO_ROOT / "README.md").read_text()
    code = (REPO_ROOT / "examples" / "ddp_helpers.py").read_text()
    body = code[code.index("from __future__ import annotations") :]
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert body in blocks, "README's helper example differs from examples/ddp_helpers.py: copy the file's code over"
