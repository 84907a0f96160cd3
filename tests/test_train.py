"""train.py end to end: real processes, real torchrun, a tiny synthetic dataset on the CPU."""

from __future__ import annotations

import csv
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ddp_utils.data import make_shapes_dataset
from ddp_utils.run import TrainState, load_checkpoint
from ddp_utils.run.report import parse_epoch_lines

from .multiproc import REPO_ROOT, collect, descendants, describe, free_port, launcher_env

TINY = {"n_train": 32, "n_val": 16, "size": "[128, 160]", "imgsz": 128}


def tiny_data_yaml(directory: Path, name: str = "tiny") -> Path:
    """A shapes-style data yaml whose generator makes a 32 + 16 image set on first use."""
    yaml_file = directory / f"{name}.yaml"
    yaml_file.write_text(
        f"path: {directory / name}\ntrain: images/train\nval: images/val\n"
        "names: {0: circle, 1: square, 2: triangle, 3: star}\n"
        f"n_train: {TINY['n_train']}\nn_val: {TINY['n_val']}\nsize: {TINY['size']}\nseed: 0\nmax_objects: 4\n"
        "download: ddp_utils.data.synthetic:generate\n"
    )
    return yaml_file


def train_env(datasets: Path | None = None) -> dict[str, str]:
    env = launcher_env()
    if datasets is not None:
        env["DDP_UTILS_DATASETS_DIR"] = str(datasets)
    return env


def train_args(data: Path, project: Path, *extra: str) -> list[str]:
    return [
        "train.py", "--data", str(data), "--cfg", "yolov5n.yaml", "--hyp", "hyp.shapes.yaml",
        "--imgsz", str(TINY["imgsz"]), "--batch-size", "8", "--workers", "1", "--project", str(project),
        "--name", "run", "--device", "cpu", *extra,
    ]  # fmt: skip


def start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def run(cmd: list[str], env: dict[str, str], timeout: float):
    (result,) = collect([start(cmd, env)], time.monotonic(), timeout, " ".join(cmd[:6]))
    return result


def torchrun(nproc: int, *args: str, port: int | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    port = port or free_port()
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(port), *extra, *args,
    ]  # fmt: skip


def wait_for_file(path: Path, proc: subprocess.Popen, seconds: float) -> None:
    """Poll until ``path`` exists (checkpoints are written atomically: then it is whole)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None and not path.exists():
        time.sleep(0.1)
    assert path.exists(), f"{path} did not appear within {seconds} s"


def results(run_dir: Path) -> list[dict[str, float]]:
    with open(run_dir / "results.csv", newline="") as f:
        return [{k.strip(): float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def assert_run_outputs(run_dir: Path, epochs: int) -> list[dict[str, float]]:
    for name in ("weights/last.pt", "weights/best.pt", "results.csv", "results.png", "hyp.yaml", "opt.yaml",
                 "labels.jpg", "train_batch0.jpg"):  # fmt: skip
        assert (run_dir / name).is_file() and (run_dir / name).stat().st_size > 0, name
    rows = results(run_dir)
    assert [int(r["epoch"]) for r in rows] == list(range(epochs))
    best = load_checkpoint(run_dir / "weights" / "best.pt")
    assert best["optimizer"] is None and best["epoch"] == -1  # stripped for inference
    last = load_checkpoint(run_dir / "weights" / "last.pt")
    assert last["epoch"] == epochs - 1 and last["optimizer"] is not None
    return rows


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_single_process_two_epochs(tmp_path):
    data = tiny_data_yaml(tmp_path)
    result = run([sys.executable, *train_args(data, tmp_path / "runs", "--epochs", "2")], train_env(), 280)
    assert result.returncode == 0, describe([result])
    assert_run_outputs(tmp_path / "runs" / "run", epochs=2)
    assert "final mAP@0.5" in result.stderr
    # one line per epoch, in a form benchmarks parse; evaluate's own summary line is not repeated
    assert [e["epoch"] for e in parse_epoch_lines(result.stderr)] == [1, 2], result.stderr
    assert not re.search(r"val: \d+ images, \d+ labels: P", result.stderr), result.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_torchrun_two_processes_loss_goes_down(tmp_path):
    data = tiny_data_yaml(tmp_path)
    cmd = torchrun(2, *train_args(data, tmp_path / "runs", "--epochs", "4"))
    result = run(cmd, train_env(), 380)
    assert result.returncode == 0, describe([result])
    rows = assert_run_outputs(tmp_path / "runs" / "run", epochs=4)
    loss = [r["train/box_loss"] + r["train/obj_loss"] + r["train/cls_loss"] for r in rows]
    assert loss[-1] < loss[0], loss
    # only rank 0 writes: one run directory, one progress line per epoch
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["run"]


def _worker_pids(parent: int) -> dict[int, int]:
    """{LOCAL_RANK: pid} of the train.py workers that a torchrun process started (read from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = dict(kv.split(b"=", 1) for kv in (entry / "environ").read_bytes().split(b"\0") if b"=" in kv)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if b"train.py" in cmdline and b"LOCAL_RANK" in environ:
            found[int(environ[b"LOCAL_RANK"])] = int(entry.name)
    return found


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(500)
def test_two_nodes_on_localhost_each_with_its_own_dataset(tmp_path):
    data = tiny_data_yaml(tmp_path)
    endpoint = f"127.0.0.1:{free_port()}"
    procs = []
    for node in (0, 1):
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
            "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", "twonode",
            *train_args(data, tmp_path / f"runs{node}", "--epochs", "2"),
        ]  # fmt: skip
        # a relative dataset path resolves under each node's own datasets directory
        data_node = tmp_path / f"node{node}"
        data_node.mkdir()
        yaml_file = data_node / "tiny.yaml"
        yaml_file.write_text(data.read_text().replace(f"path: {tmp_path / 'tiny'}", "path: tiny"))
        cmd[cmd.index(str(data))] = str(yaml_file)
        procs.append(start(cmd, train_env(datasets=data_node / "datasets")))
    nodes = collect(procs, time.monotonic(), 450, "two-node torchrun")
    assert all(n.returncode == 0 for n in nodes), describe(nodes)
    for node in (0, 1):
        caches = sorted((tmp_path / f"node{node}" / "datasets" / "tiny" / "labels").glob("*.cache"))
        assert [c.name for c in caches] == ["train.ddp.cache", "val.ddp.cache"], node
    # the global rank 0 (node 0) writes the run; node 1 writes nothing
    assert_run_outputs(tmp_path / "runs0" / "run", epochs=2)
    assert not (tmp_path / "runs1").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--batch-size", "3"], {"WORLD_SIZE": "2"}, "does not divide by WORLD_SIZE=2"),
        (["--image-weights"], {"WORLD_SIZE": "2"}, "--image-weights works in a single process only"),
        (["--rect", "--multi-scale"], {}, "--rect and --multi-scale"),
        (["--epochs", "0"], {}, "--epochs 0"),
        (["--batch-size", "-2"], {}, "--batch-size -2"),
        (["--requeue-signal", "USR9"], {}, "--requeue-signal='USR9' is no signal"),
    ],
)
def test_bad_combinations_fail_before_any_process_group(args, env, message, tmp_path):
    launch_env = train_env()
    if env:
        launch_env.update(RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1", **env)
    result = run([sys.executable, "train.py", *args, "--device", "cpu", "--project", str(tmp_path)], launch_env, 100)
    assert result.returncode == 2 and message in result.stderr, describe([result])
    assert "process group" not in result.stderr


def import_train():
    sys.path.insert(0, str(REPO_ROOT))
    try:
        import train
    finally:
        sys.path.pop(0)
    return train


def test_local_rank_argument_is_accepted_and_ignored():
    train = import_train()
    assert train.parse_opt(["--local_rank", "3"]).local_rank == 3
    assert train.parse_opt(["--local-rank=1"]).local_rank == 1


def test_yolov5_call_forms_parse_opt_true_and_run_refusing_an_unknown_name(monkeypatch):
    train = import_train()
    monkeypatch.setattr(sys, "argv", ["script.py", "--epochs", "7", "--not-ours", "x", "-q"])
    opt = train.parse_opt(True)  # YOLOv5's parse_opt(known=True): the known options, the rest ignored
    assert opt.epochs == 7 and opt.imgsz == 640  # YOLOv5's default (a data yaml's train_defaults may replace it)
    with pytest.raises(SystemExit):
        train.parse_opt(False)
    with pytest.raises(TypeError, match="train.run: no option named epochz, imgs"):
        train.run(epochz=3, imgs=320)  # refused before anything runs (YOLOv5 would set and ignore them)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_run_from_python_trains_as_the_command_line_does(tmp_path):
    data = tiny_data_yaml(tmp_path)
    code = (
        "import train; opt = train.run("
        f"data={str(data)!r}, cfg='yolov5n.yaml', hyp='hyp.shapes.yaml', imgsz=128, batch_size=8, workers=0, "
        f"epochs=1, project={str(tmp_path / 'runs')!r}, name='run', device='cpu', noplots=True); print(opt.epochs)"
    )
    result = run([sys.executable, "-c", code], train_env(), 280)
    assert result.returncode == 0, describe([result])
    assert result.stdout.strip().splitlines()[-1] == "1"
    with (tmp_path / "runs" / "run" / "results.csv").open() as f:
        assert [row["epoch"] for row in csv.DictReader(f)] == ["0"]
    assert load_checkpoint(tmp_path / "runs" / "run" / "weights" / "last.pt")["epoch"] == 0


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(400)
@pytest.mark.parametrize("nproc", [1, 2])
def test_sigterm_saves_a_checkpoint_and_every_process_exits(tmp_path, nproc):
    data = tiny_data_yaml(tmp_path)
    args = train_args(data, tmp_path / "runs", "--epochs", "50")
    proc = start(torchrun(2, *args) if nproc == 2 else [sys.executable, *args], train_env())
    last = tmp_path / "runs" / "run" / "weights" / "last.pt"
    wait_for_file(last, proc, 300)
    saved_epoch = load_checkpoint(last)["epoch"]
    workers = descendants(proc.pid)
    os.kill(proc.pid, signal.SIGTERM)
    start_time = time.monotonic()
    (result,) = collect([proc], start_time, 90, "SIGTERM to the job")
    assert time.monotonic() - start_time < 60, describe([result])
    # a single process exits 0; torchrun's agent reports the signal with exit code 1 (see README)
    assert result.returncode == (0 if nproc == 1 else 1), describe([result])
    assert "stopped at epoch" in result.stderr and "continue with: python train.py --resume" in result.stderr
    for rank in range(nproc):  # once each: a data-loader worker the signal reached too says nothing
        said = f"{'[rank 1] ' if rank else ''}received SIGTERM: finishing this step"
        assert sum(line.startswith(said) for line in result.stderr.splitlines()) == 1, describe([result])
    # no rank died of an error on the way out (torchrun prefixes a rank's traceback with [rankN]:)
    assert "[rank0]:" not in result.stderr and "[rank1]:" not in result.stderr
    assert nproc == 2 or "Traceback" not in result.stderr
    assert load_checkpoint(last)["epoch"] >= saved_epoch  # the newest state, whole
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()], "processes outlived the job"


def _user_error_case(case: str, tmp_path: Path) -> tuple[list[str], str]:
    """The arguments of one user mistake, and what its message must name."""
    if case == "missing data path":
        data = tmp_path / "gone.yaml"
        data.write_text(f"path: {tmp_path / 'nowhere'}\ntrain: images/train\nval: images/val\nnames: {{0: a}}\n")
        return ["--data", str(data)], str(tmp_path / "nowhere")
    if case == "device not here":
        return ["--device", "3"], "device '3'"
    if case == "resume of a missing file":
        return ["--resume", str(tmp_path / "old" / "last.pt")], str(tmp_path / "old" / "last.pt")
    if case == "image size below the stride":
        return ["--imgsz", "16"], "--imgsz 16 is below the model's stride 32"
    if case == "unreadable checkpoint":
        (tmp_path / "junk.pt").write_bytes(b"not a checkpoint" * 64)
        return ["--weights", str(tmp_path / "junk.pt")], str(tmp_path / "junk.pt")
    make_shapes_dataset(tmp_path / "shapes", n_train=4, n_val=2, size=(64, 96), seed=0)  # classes 0..3
    data = tmp_path / "two.yaml"
    data.write_text(f"path: {tmp_path / 'shapes'}\ntrain: images/train\nval: images/val\nnames: {{0: a, 1: b}}\n")
    return ["--data", str(data), "--imgsz", "64", "--batch-size", "2", "--workers", "0"], ".txt: class"


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "case",
    [
        "missing data path",
        "device not here",
        "resume of a missing file",
        "unreadable checkpoint",
        "label class >= nc",
        "image size below the stride",
    ],
)
def test_user_errors_are_one_line_exit_2_and_leave_no_run_directory(case, tmp_path):
    if case == "device not here" and torch.cuda.device_count() > 3:
        pytest.skip("this host has a CUDA device 3")
    args, named = _user_error_case(case, tmp_path)
    project = tmp_path / "runs"
    cmd = [sys.executable, "train.py", "--device", "cpu", "--epochs", "1", "--project", str(project), *args]
    result = run(cmd, train_env(), 130)
    assert result.returncode == 2, describe([result])
    assert "Traceback" not in result.stderr, describe([result])
    errors = [line for line in result.stderr.splitlines() if "train.py: error:" in line]
    assert len(errors) == 1 and named in errors[0], describe([result])
    assert not project.exists() or not any(project.iterdir()), sorted(project.rglob("*"))


HELD = """
import atexit, runpy, sys, time
from ddp_utils.run.checkpoint import disk as files
hold, sys.argv = sys.argv[1], ["train.py", *sys.argv[2:]]
write = files.write_serialised

def held(ckpt, paths):  # the run's first save is the stop's (in epoch 1, no periodic save), held when it is written
    if hold == "stop save":
        print("holding the stop save", file=sys.stderr, flush=True)
        time.sleep(600)
    return write(ckpt, paths)

files.write_serialised = held
runpy.run_path("train.py", run_name="__main__")
if hold == "exit":  # the stopped run's last seconds: its exit handlers (workers joined, the interpreter's exit)
    atexit.register(lambda: (print("exiting", file=sys.stderr, flush=True), time.sleep(600)))
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("second", [None, "stop save", "exit"])
def test_ctrl_c_once_saves_and_stops_twice_stops_at_once_in_one_line(tmp_path, second):
    """Each press as a terminal sends it (SIGINT to the process group, its loader workers too), the second once the
    run is where the case holds it: the stop save still being written, or its exit handlers running."""
    from .multiproc import run_watching

    data = tiny_data_yaml(tmp_path)
    env = train_env() | {"DDP_UTILS_PROGRESS": "plain", "DDP_UTILS_PROGRESS_SECONDS": "0"}
    pressed: list[float] = []

    def on_line(line: str, proc: subprocess.Popen) -> None:
        first = re.match(r"^1/\d+ .* \d+/\d+ \d+%", line) and not pressed  # training has started
        if first or (pressed and len(pressed) < 2 and second and line.strip() in ("holding the stop save", "exiting")):
            os.killpg(proc.pid, signal.SIGINT)
            pressed.append(time.monotonic())

    args = train_args(data, tmp_path / "runs", "--epochs", "2")[1:]
    command = [sys.executable, *(["-c", HELD, second] if second else ["train.py"]), *args]
    result = run_watching(command, env, 360, on_line)
    output = describe([result])
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, output
    assert result.stderr.count("received SIGINT: finishing this step") == 1, output
    last = tmp_path / "runs" / "run" / "weights" / "last.pt"
    if second is None:  # the first press finishes the step, saves and stops, as SIGTERM does
        assert result.returncode == 0 and "stopped at epoch 1, batch" in result.stderr, output
        return
    assert result.returncode == 130 and len(pressed) == 2, output
    assert time.monotonic() - pressed[1] < 60, output  # at once: the hold it cut short was 600 s
    line = result.stderr.strip().splitlines()[-1]
    again = "train.py: interrupted by Ctrl-C (pressed again: stopped at once); "
    if second == "stop save":  # the first press's save, said undone; nothing was on disk before it
        assert line == f"{again}the save of {last} being written is not finished, no {last} is on disk: nothing " \
            "to resume from", output  # fmt: skip
        assert not last.exists(), output
    else:  # the first press's save, done
        where = TrainState.from_checkpoint(load_checkpoint(last)).where()
        assert f"stopped at {where}: saved {last} in " in result.stderr, output
        resume = f"python train.py --resume {last} continues from {where}"
        assert line == f"{again}the {last} on disk is from {where}: {resume}", output


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_run_whose_final_save_fails_exits_74_saying_what_is_on_disk_and_never_done(tmp_path):
    # the 3 MiB tmpfs as --project: every checkpoint write fails (here by a file-size limit that the small
    # files stay under: no root, no mount); it said "2 epochs done", exit 0, with weights/ empty
    def small_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 * 2**20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    data = tiny_data_yaml(tmp_path)
    cmd = [sys.executable, *train_args(data, tmp_path / "runs", "--epochs", "2")]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=small_disk)  # fmt: skip
    (result,) = collect([proc], time.monotonic(), 380, "a run on a full disk")
    output, last = describe([result]), tmp_path / "runs" / "run" / "weights" / "last.pt"
    assert result.returncode == 74, output
    assert "epochs done" not in result.stderr and "Traceback" not in result.stderr, output
    failed = [line for line in result.stderr.splitlines() if line.startswith(f"could not save checkpoint {last}")]
    assert len(failed) == 2 and "File too large" in failed[0], output
    assert failed[0].endswith("the next save is tried as usual") and "the next save" not in failed[1], output
    assert result.stderr.strip().splitlines()[-1] == (
        f"train.py: save failed: training ended after epoch 2 but could not save {last} (the warning above says why), "
        "and none is on disk: nothing to resume from"
    ), output
    assert not last.exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_trackers_get_a_real_run(tmp_path):
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    data = tiny_data_yaml(tmp_path)
    env = train_env() | {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    args = train_args(data, tmp_path / "runs", "--epochs", "1", "--trackers", "mlflow", "wandb")
    result = run([sys.executable, *args], env, 280)
    assert result.returncode == 0, describe([result])
    assert "mlflow: tracking this run (sqlite:///" in result.stderr, describe([result])
    assert "wandb: tracking this run (mode offline)" in result.stderr, describe([result])
    assert (tmp_path / "runs" / "mlflow.db").is_file()
    assert list((tmp_path / "runs" / "mlartifacts").rglob("weights/best.pt")), "the weights were not logged"
    assert list((tmp_path / "runs" / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
