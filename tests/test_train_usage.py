"""What a user meets around train.py: errors under torchrun, logs in a file, YOLOv5's habits, file modes.

Real train.py processes on the CPU (real torchrun with gloo where it says so), bounded by timeouts.
"""

from __future__ import annotations

import re
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_utils.progress import PROGRESS_ENV

from .multiproc import REPO_ROOT, free_port
from .test_train import describe, run, tiny_data_yaml, torchrun, train_args, train_env


def _errors_case(case: str, tmp_path: Path) -> tuple[list[str], str]:
    if case == "batch size not a multiple":
        return ["--batch-size", "3"], "--batch-size 3 does not divide by WORLD_SIZE=2"
    if case == "dataset download fails":  # offline, say: the node's first process fetches, the other waits
        url = f"http://127.0.0.1:{free_port()}/data.zip"  # nothing listens there
        data = tmp_path / "far.yaml"
        data.write_text(f"path: {tmp_path / 'far'}\ntrain: images\nval: images\nnames: {{0: a}}\ndownload: {url}\n")
        return ["--data", str(data)], f"could not fetch the dataset: download {url}"
    missing = tmp_path / "missing.yaml"
    return ["--data", str(missing)], str(missing)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", ["batch size not a multiple", "missing data yaml", "dataset download fails"])
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
    failures = output[output.index("train.py FAILED") :]
    assert re.search(r"exitcode\s*: 2 ", failures), describe([result])  # the worker's own code, in the report
    report = output[output.index("Root Cause") :]
    # torchrun's root cause is the earliest error file: the first process's (exit 2), or a follower's that wrote its
    # file in an earlier second and, lingering for the first to print the line, was ended by the agent (SIGTERM)
    assert re.search(r"exitcode\s*: (2|-15) ", report), describe([result])
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


def _train_to_files(
    tmp_path: Path, name: str, *extra: str, umask: int = 0o022, env_extra: dict | None = None
) -> tuple[int, str, Path]:
    """A tiny 1-epoch train.py run with stdout and stderr going to files (as under SLURM or nohup)."""
    data = tiny_data_yaml(tmp_path) if not (tmp_path / "tiny.yaml").exists() else tmp_path / "tiny.yaml"
    env = train_env()
    env.pop(PROGRESS_ENV, None)
    env.update(env_extra or {})
    log = tmp_path / f"{name}.log"
    cmd = [sys.executable, *train_args(data, tmp_path / name, "--epochs", "1", *extra)]
    with open(log, "w") as out:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=280,
                              umask=umask)  # fmt: skip
    return proc.returncode, log.read_text(), tmp_path / name / "run"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_log_in_a_file_has_plain_progress_lines_and_off_has_none_and_files_follow_the_umask(tmp_path):
    code, text, run_dir = _train_to_files(tmp_path, "plain", env_extra={"DDP_UTILS_PROGRESS_SECONDS": "0"})
    assert code == 0, text
    assert "\r" not in text  # no bar redraws in a file
    assert re.search(r"^train: scanning .* 32/32 100% ", text, re.M), text  # the label scan ends at n/n
    # a line per batch here (every 0 s), each with the loss so far: the description is set before the line
    steps = re.findall(r"^1/1 mem - box \d\.\d{4} obj \d\.\d{4} cls \d\.\d{4} inst \d+ size 128 (\d)/4 ", text, re.M)
    assert steps == ["1", "2", "3", "4"], text
    assert re.search(r"^1/1 mem - box \d\.\d{4} obj \d\.\d{4} cls \d\.\d{4} 4/4 100% ", text, re.M), text
    assert re.search(r"^epoch 1/1: loss ", text, re.M), text
    for name in ("weights/last.pt", "weights/best.pt", "results.csv", "opt.yaml"):  # as open() makes them: 0644
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o644, name

    code, text, run_dir = _train_to_files(tmp_path, "off", "--progress", "off", umask=0o027)
    assert code == 0, text
    assert "\r" not in text and "100%" not in text and not re.search(r"\d+/\d+ \d+%", text), text
    assert re.search(r"^epoch 1/1: loss ", text, re.M), text  # the epoch line stays
    assert stat.S_IMODE((run_dir / "weights" / "last.pt").stat().st_mode) == 0o640


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--imgsz", "-5"], "--imgsz -5: give the image size in pixels"),
        (["--epochs", "0"], "--epochs 0: train at least one epoch"),
        (["--imgsz", "100000"], "--imgsz 100000: one batch of 16 images of 100000 x 100000 px needs at least"),
        (["--seed", "99999999999999999999"], "--seed 99999999999999999999: give a seed >= 0 and at most 2**63 - 1"),
        (["--cudnn-benchmark-limit", "99999999999999999999"], "--cudnn-benchmark-limit 99999999999999999999: give"),
        (["--requeue-signal", "9"], "--requeue-signal 9: SIGKILL cannot be caught"),
        (["--evolve", "1", "--evolve-heartbeat", "inf"], "--evolve-heartbeat inf: give seconds > 0 and at most"),
        (["--evolve", "99999999999999999999"], "--evolve 99999999999999999999: give the number of trials, at least"),
    ],
)
def test_a_bad_option_value_is_one_line_exit_2_before_anything_is_written(args, named, tmp_path):
    project, datasets = tmp_path / "runs", tmp_path / "datasets"
    cmd = [sys.executable, "train.py", "--device", "cpu", "--project", str(project), *args]
    result = run(cmd, train_env(datasets=datasets), 100)
    assert result.returncode == 2, describe([result])
    errors = [line for line in result.stderr.splitlines() if "train.py: error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"train.py: error: {named}"), describe([result])
    assert "Traceback" not in result.stderr, describe([result])
    assert not project.exists() and not datasets.exists()  # refused before the data or a run directory


@pytest.mark.timeout(200)
def test_an_image_size_past_the_address_space_limit_is_one_line_exit_2_before_anything_is_written(tmp_path):
    """``ulimit -v``: the host's free memory says nothing of it; the batch (2 GiB of 12000 px images) would end in a
    traceback from the allocator, after the data and a run directory."""
    probe = "import resource, train; from ddp_utils.host import _status_bytes; print(_status_bytes('VmSize'))"
    mapped = int(run([sys.executable, "-c", probe], train_env(), 100).stdout.split()[-1])
    limit = mapped + 2**30  # a gibibyte more than train.py maps once imported

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))

    project, datasets = tmp_path / "runs", tmp_path / "datasets"
    cmd = [sys.executable, "train.py", "--device", "cpu", "--project", str(project), "--imgsz", "12000",
           "--batch-size", "1", "--workers", "0", "--epochs", "1"]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO_ROOT, env=train_env(datasets=datasets), capture_output=True, text=True,
                            timeout=180, preexec_fn=limited, check=False)  # fmt: skip
    assert result.returncode == 2, describe([result])
    errors = [line for line in result.stderr.splitlines() if "train.py: error:" in line]
    assert len(errors) == 1 and "--imgsz 12000: one batch of 1 images of 12000 x 12000 px needs at least" in errors[0]
    assert "its address-space limit, ulimit -v" in errors[0] and "Traceback" not in result.stderr, describe([result])
    assert not project.exists() and not datasets.exists()


@pytest.mark.timeout(300)
def test_a_batch_larger_than_the_dataset_trains_it_and_says_what_it_costs(tmp_path):
    """YOLOv5 trains ``--batch-size 20000`` on 32 images (its loader cut to them) with weight decay scaled for
    20,000: the log says so once; the shared-memory slots are sized for the 32 (they were for 20,000)."""
    data = tiny_data_yaml(tmp_path)
    extra = ("--epochs", "1", "--batch-size", "20000", "--imgsz", "64")  # 1.2 GiB for the up-front check: it passes
    result = run([sys.executable, *train_args(data, tmp_path / "runs", *extra)], train_env(), 280)
    assert result.returncode == 0, describe([result])
    warned = [line for line in result.stderr.splitlines() if line.startswith("--batch-size 20000 is more than")]
    assert len(warned) == 1, describe([result])
    assert "the 32 training images: each step trains on those 32 (one step an epoch)" in warned[0]
    assert "weight decay x625 what 32 would give): give --batch-size 32 or less" in warned[0]
    assert re.search(r"^1/1 .* 1/1 100% ", result.stderr, re.M), result.stderr  # one step of the 32
