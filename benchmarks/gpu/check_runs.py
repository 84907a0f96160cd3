"""The GPU check's parts that run something: each in a child process bounded by its timeout (its whole process
group killed after), its output in a log; a part that gives no figures raises :class:`PartFailed` with the reason.

Every child keeps the caller's PYTHONPATH (``benchmarks/child_env.py``): on a host without network the wheels it
lacks are there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))  # benchmarks/: child_env
from child_env import with_pythonpath, without_checkout  # noqa: E402

PROGRESS_MEM = re.compile(r"(?:^|[\r\n])\s*(\d+)/(\d+) mem (\S+) ")  # train.py's progress line: "2/4 mem 3.21G box"
MADE_ON = re.compile(r"images made on [^\r\n]*")
MAP = re.compile(r"mAP@0\.5 ([0-9.]+) mAP@0\.5:0\.95 ([0-9.]+)")
FLAT = 0.02  # reserved memory within 2 % over epochs 2-4


class PartFailed(RuntimeError):
    """A part that gave no figures (or the wrong ones): its message is the row's reason; ``figures`` what it did
    measure, kept in the JSON line."""

    def __init__(self, reason: str, figures: dict | None = None) -> None:
        super().__init__(reason)
        self.figures = figures or {}


@dataclass
class Context:
    """What the parts share: the options, the work directory, the data the first part made, the logs kept."""

    opt: Any
    work: Path
    data: Path | None = None
    logs: dict[str, Path] = field(default_factory=dict)

    @property
    def train_images(self) -> Path:
        if self.data is None:
            raise PartFailed("no data: the data part failed")
        return self.data.parent / "side_data" / "images" / "train"

    def made_on(self, augment_on: str = "auto") -> str:
        """The "images made on" line a train.py row must log: the device on CUDA unless told the workers."""
        if augment_on == "workers" or self.opt.device == "cpu":
            return "images made on the loader workers"
        return f"images made on the device cuda:{int(self.opt.device) if self.opt.device.isdigit() else 0}"


def run_child(command: list[str], timeout: float, log: Path, cwd: Path = REPO, env: dict | None = None) -> str:
    """Run ``command`` to its end within ``timeout`` s, its output to ``log``; returns the output. Raises
    PartFailed with the reason otherwise (the whole process group killed on a timeout: loader workers too)."""
    if timeout <= 1:
        raise PartFailed("no time left in the check's budget")
    with log.open("w") as out:
        proc = subprocess.Popen(
            command, cwd=cwd, env=env or with_pythonpath(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise PartFailed(f"timed out after {timeout:.0f} s, its budget (log: {log})") from None
    text = log.read_text(errors="replace")
    if code != 0:
        last = [line.strip() for line in text.splitlines() if line.strip()][-1:] or ["no output"]
        raise PartFailed(f"exit {code}: {last[0][:160]}")
    return text


def tagged_json(text: str, tag: str) -> dict:
    """The JSON of the last ``TAG {json}`` line of a child's output."""
    found = [line for line in text.splitlines() if line.startswith(tag + " ")]
    if not found:
        raise PartFailed(f"no {tag} line in its output")
    return json.loads(found[-1].removeprefix(tag + " "))


# ---- the data ----


def _make_share(args: tuple[Path, int, int, tuple[int, int], int]) -> Path:
    from ddp_utils.data.synthetic import make_shapes_dataset

    root, n_train, n_val, size, seed = args
    return make_shapes_dataset(root, n_train, n_val, size=size, seed=seed)


def make_side_data(work: Path, n_train: int, n_val: int, imgsz: int, processes: int) -> Path:
    """Synthetic shapes of 3/4 to 1 x imgsz px, made in ``processes`` shares at once (2,000 at 640 px take 70 s in
    one process), gathered into ``work/side_data``; returns its data yaml (ours and YOLOv5's alike)."""
    from ddp_utils.data.synthetic import DEFAULT_CLASSES

    shares = max(1, min(processes, n_train))
    size = (max(imgsz * 3 // 4, 32), max(imgsz, 32))

    def share(n: int, k: int) -> int:  # the k-th of ``shares`` near-equal parts of n
        return n // shares + (k < n % shares)

    jobs = [(work / "shares" / f"{k:02d}", share(n_train, k), share(n_val, k), size, k) for k in range(shares)]
    with ProcessPoolExecutor(shares) as pool:
        roots = list(pool.map(_make_share, jobs))
    root = work / "side_data"
    for k, share in enumerate(roots):
        for kind in ("images", "labels"):
            for split in ("train", "val"):
                (root / kind / split).mkdir(parents=True, exist_ok=True)
                for path in (share / kind / split).iterdir():
                    path.rename(root / kind / split / f"{k:02d}_{path.name}")
    shutil.rmtree(work / "shares", ignore_errors=True)
    names = "\n".join(f"  {i}: {cls}" for i, cls in enumerate(DEFAULT_CLASSES))
    data = work / "side_data.yaml"
    data.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}\n")
    return data


# ---- train.py rows, ours and YOLOv5's ----


def common(opt: Any, data: Path) -> list[str]:
    """The settings both train.py take, with the same meaning."""
    return [
        "--weights", "", "--data", str(data), "--imgsz", str(opt.imgsz), "--batch-size", str(opt.batch),
        "--workers", str(opt.workers), "--epochs", str(opt.epochs), "--device", opt.device,
        "--noval", "--nosave", "--noplots", "--exist-ok",
    ]  # fmt: skip


def epoch_figures(epoch_seconds: list[float], wall: float, data_wait: list[float] | None = None) -> dict:
    """Steady epoch (the median of epochs 2 on), first epoch, whole run, data wait (mean of epochs 2 on)."""
    if not epoch_seconds:
        raise PartFailed("no epoch figures in its log")
    steady = epoch_seconds[1:] or epoch_seconds
    figures = dict(steady_epoch_s=statistics.median(steady), first_epoch_s=epoch_seconds[0], run_s=wall)
    figures["epochs_s"] = [round(s, 3) for s in epoch_seconds]
    if data_wait:
        figures["data_wait"] = statistics.fmean(data_wait[1:] or data_wait)
    return figures


def check_made_on(log: str, expected: str, figures: dict) -> dict:
    """``figures`` with the log's "images made on" line, or PartFailed (the figures kept) when it is not the one
    the row expects: a row must say which path it measured."""
    found = MADE_ON.search(log)
    figures = dict(figures, made_on=found.group(0).strip() if found else None)
    if not found or not found.group(0).startswith(expected):
        said = f'"{found.group(0).strip()[:120]}"' if found else "no such line"
        raise PartFailed(f'expected "{expected}", its log says {said}', figures)
    return figures


def ours(ctx: Context, key: str, extra: list[str], timeout: float) -> dict:
    """Our train.py at the check's settings plus ``extra``: its epoch lines, wall and "images made on" line."""
    opt, data = ctx.opt, ctx.data
    if data is None:
        raise PartFailed("no data: the data part failed")
    command = [sys.executable, str(REPO / "train.py"), "--cfg", opt.cfg, *common(opt, data), "--progress", "plain"]
    command += ["--project", str(ctx.work / "runs"), "--name", key, *extra]
    log_path = ctx.logs[key] = ctx.work / f"{key}.log"
    start = _now()
    log = run_child(command, timeout, log_path)
    from ddp_utils.run.report import parse_epoch_lines  # the epoch line's format and its parser, one home

    epochs = parse_epoch_lines(log)
    seconds = [opt.images / epoch["img_s"] for epoch in epochs if epoch["img_s"] > 0]
    figures = epoch_figures(seconds, _now() - start, [epoch["data_wait_share"] for epoch in epochs])
    expected = ctx.made_on("workers" if "workers" in extra else "auto")
    return check_made_on(log, expected, figures)


def yolov5(ctx: Context, timeout: float) -> dict:
    """YOLOv5 v7.0's train.py at the same settings, its epochs timed by its own callbacks (yolov5_timed.py)."""
    opt = ctx.opt
    if opt.yolov5 is None:
        raise PartFailed("skipped: no --yolov5 DIR")
    if ctx.data is None:
        raise PartFailed("no data: the data part failed")
    fonts = ctx.work / "yolov5_config"  # YOLOv5 fetches Arial.ttf at start-up; offline, give it one
    fonts.mkdir(exist_ok=True)
    import matplotlib

    shutil.copy(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf", fonts / "Arial.ttf")
    env = without_checkout() | dict(
        YOLOV5_CONFIG_DIR=str(fonts), TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", YOLOv5_AUTOINSTALL="false"
    )
    times = ctx.work / "yolov5_epochs.jsonl"
    command = [opt.yolov5_python or sys.executable, str(HERE / "yolov5_timed.py"), "--yolov5", str(opt.yolov5)]
    command += ["--times", str(times), "--", "--cfg", f"models/{opt.cfg}", *common(opt, ctx.data)]
    command += ["--project", str(ctx.work / "yolov5"), "--name", "run"]
    start = _now()
    run_child(command, timeout, ctx.work / "yolov5.log", cwd=opt.yolov5.resolve(), env=env)
    from yolov5_timed import read_first_batch, read_times

    return dict(epoch_figures(read_times(times), _now() - start), first_batch_s=read_first_batch(times))


def first_step(ctx: Context, timeout: float) -> dict:
    """The time to the first finished batch and from the last line to the exit (``speed/device_start.py``), on 256
    of the training images for 1 epoch at the check's settings: the device path with an empty kernel cache (its
    compile beside it), then the check's kernels compiled (timed: the cold compile on this machine; the later parts
    find them made), the device path again with them, and the loader workers' path."""
    opt = ctx.opt
    subset = _subset_data(ctx, 256)
    modes = ["device-cold", "device-warm", "workers"]
    command = [sys.executable, str(REPO / "benchmarks" / "speed" / "device_start.py"), "--parts", "runs", "--modes",
               *modes, "--data", str(subset), "--cfg", opt.cfg, "--imgsz", str(opt.imgsz), "--batch", str(opt.batch),
               "--workers", str(opt.workers), "--device", opt.device, "--dir", str(ctx.work / "first_step"),
               "--timeout", f"{max(timeout / 4, 10):.0f}", *([] if opt.cpu_smoke else ["--prime-mixup"])]  # fmt: skip
    cache = os.environ.get("DDP_UTILS_KERNEL_CACHE")
    if cache:
        command += ["--warm-cache", cache]
    result = tagged_json(run_child(command, timeout, ctx.work / "first_step.log"), "RESULT")
    by_mode = {run["mode"]: run for run in result["runs"]}
    figures = {}
    for mode in modes:
        run = by_mode.get(mode, {})
        figures[mode] = {k: run.get(k) for k in ("first_batch_s", "exit_after_last_line_s", "code", "traceback")}
        figures[mode]["made_on"] = run.get("made_on")
    figures["compile_cold_s"] = by_mode.get("compile", {}).get("seconds")
    device = "cpu" if opt.device == "cpu" else f"cuda:{int(opt.device) if opt.device.isdigit() else 0}"
    expected = {mode: f"images made on the device {device}" for mode in modes[:2]}
    expected["workers"] = "images made on the loader workers"
    wrong = [mode for mode in modes if not str(figures[mode]["made_on"]).startswith(expected[mode])]
    if wrong:
        raise PartFailed(f"the runs {', '.join(wrong)} made their images elsewhere than asked", figures)
    return figures


def _subset_data(ctx: Context, n: int) -> Path:
    # the first n training images of the check's data, as a list file (the YOLO format's image lists)
    images = sorted(ctx.train_images.iterdir())[:n]
    listed = ctx.work / f"first_{n}.txt"
    listed.write_text("".join(f"{path}\n" for path in images))
    data = ctx.work / f"first_{n}.yaml"
    names = (ctx.data.read_text().split("names:", 1)[1]) if ctx.data else " {0: circle}\n"
    data.write_text(f"train: {listed}\nval: {listed}\nnames:{names}")
    return data


def forms(ctx: Context, timeout: float) -> dict:
    """The two forms of the device render on this device, compared batch by batch (forms_equal.py): the values
    that differ (0: where a run switches from one to the other changes nothing)."""
    opt = ctx.opt
    command = [sys.executable, str(HERE / "forms_equal.py"), "--images", str(ctx.train_images), "--device", opt.device]
    if opt.cpu_smoke:
        command += ["--imgsz", str(opt.imgsz), "--batch", str(opt.batch), "--batches", "4", "--workers", "0"]
        command += ["--mixup", "0"]  # the kernels the first step compiled (the mixups' too on a card)
    command += ["--compile-timeout", f"{max(timeout - 30, 5):.0f}"]
    got = tagged_json(run_child(command, timeout, ctx.work / "forms.log"), "FORMS")
    if "error" in got:
        raise PartFailed(got["error"], got)
    return got


def memory(ctx: Context, timeout: float) -> dict:
    """Reserved memory at the end of each epoch, read from the default row's own progress lines (``mem``)."""
    log = ctx.logs.get("ours")
    if log is None or not log.exists():
        raise PartFailed("the default row left no log to read")
    last: dict[int, str] = {}
    for epoch, _, value in PROGRESS_MEM.findall(log.read_text(errors="replace")):
        last[int(epoch)] = value
    if not last:
        raise PartFailed("no progress line with mem in the default row's log")
    reserved = [float(v.rstrip("G")) if v.endswith("G") else None for _, v in sorted(last.items())]
    later = [v for v in reserved[1:] if v is not None]
    spread = (max(later) - min(later)) / min(later) if later and min(later) > 0 else None
    flat = None if spread is None else spread <= FLAT
    return dict(epochs=len(reserved), reserved_gib=reserved, spread=spread, flat=flat)


def default_job(ctx: Context, timeout: float) -> dict:
    """``python train.py --device 0`` as a user runs it first (the default data, made on first use): its mAP."""
    opt = ctx.opt
    command = [sys.executable, str(REPO / "train.py"), "--device", opt.device, "--progress", "off"]
    command += ["--project", str(ctx.work / "runs"), "--name", "default_job", "--exist-ok"]
    if opt.cpu_smoke:  # the default data's yaml, made on first use as by default, but 12 images of 64-96 px
        command += ["--data", str(_tiny_default_data(ctx.work)), "--epochs", "1", "--imgsz", "64", "--workers", "0"]
    env = with_pythonpath() | dict(DDP_UTILS_DATASETS_DIR=str(ctx.work / "datasets"))
    start = _now()
    log = run_child(command, timeout, ctx.work / "default_job.log", env=env)
    found = MAP.findall(log)
    if not found:
        raise PartFailed("no mAP in its log")
    figures = dict(map50=float(found[-1][0]), map=float(found[-1][1]), run_s=_now() - start)
    return check_made_on(log, ctx.made_on(), figures)


def _tiny_default_data(work: Path) -> Path:
    import yaml

    data = yaml.safe_load((REPO / "data" / "shapes.yaml").read_text())
    data.update(path="shapes_smoke", n_train=8, n_val=4, size=[64, 96])
    path = work / "shapes_smoke.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def loader(ctx: Context, timeout: float) -> dict:
    """The loader alone on the device path (loader_alone.py): img/s of an epoch after a warm one, render memory."""
    opt = ctx.opt
    command = [sys.executable, str(HERE / "loader_alone.py"), "--images", str(ctx.train_images)]
    command += ["--imgsz", str(opt.imgsz), "--batch", str(opt.batch), "--workers", str(opt.workers)]
    command += ["--device", opt.device]
    return tagged_json(run_child(command, timeout, ctx.work / "loader.log"), "LOADER")


def decode_order(ctx: Context, timeout: float) -> dict:
    """The decode-order reproduction (decode_order.py), iterating for the part's budget less its start-up."""
    command = [sys.executable, str(HERE / "decode_order.py"), "--images", str(ctx.train_images)]
    command += ["--cpu-smoke"] if ctx.opt.cpu_smoke else ["--device", ctx.opt.device]
    command += ["--seconds", f"{max(timeout - 15, 1):.0f}"]  # 15 s: the child's start and the decoders' warm-up
    return tagged_json(run_child(command, timeout, ctx.work / "decode_order.log"), "DECODE_ORDER")


def data(ctx: Context, timeout: float) -> dict:
    """The side-by-side's images, made in a child (this module again) with one process per core."""
    opt = ctx.opt
    n_val = max(opt.images // 8, 2)
    processes = max(1, min(os.cpu_count() or 1, 16))
    command = [sys.executable, str(Path(__file__).resolve()), "data", str(ctx.work), str(opt.images), str(n_val)]
    command += [str(opt.imgsz), str(processes)]
    start = _now()
    run_child(command, timeout, ctx.work / "data.log")
    ctx.data = ctx.work / "side_data.yaml"
    return dict(train_images=opt.images, val_images=n_val, processes=processes, run_s=_now() - start)


def cuda_tests_command(collect_only: bool) -> list[str]:
    """The tests that carry ``@pytest.mark.cuda``, slow ones included, one at a time on the one card.

    ``-o addopts=`` drops pyproject's ``-m 'not slow'`` and its pytest-xdist options (``-n auto``: eight
    processes on one GPU would measure each other; a GPU host's image may lack xdist).
    """
    command = [sys.executable, "-m", "pytest", "tests", "-m", "cuda", "-q", "-rfEs", "-p", "no:cacheprovider"]
    command += ["-o", "addopts=", "--timeout", "300", "--fast-tier-seconds", "0"]
    return command + (["--collect-only"] if collect_only else [])


def cuda_tests(ctx: Context, timeout: float) -> dict:
    """The CUDA tests (on the CPU: collected, not run), their counts, what failed or skipped; beside them the
    tests that need CUDA by their source (cuda_marks.py), marked and not."""
    import cuda_marks

    log_path = ctx.work / "cuda_tests.log"
    try:
        log = run_child(cuda_tests_command(ctx.opt.cpu_smoke), timeout, log_path)
    except PartFailed as exc:
        if not str(exc).startswith("exit 1:"):  # exit 1: some failed; the counts and names below say which
            raise
        log = log_path.read_text(errors="replace")
    counts = {key: int(n) for n, key in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", log)}
    collected = re.search(r"(\d+)(?:/\d+)? tests? collected", log)
    if collected:
        counts["collected"] = int(collected.group(1))
    failed = [line.split()[1] for line in log.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    skipped = [line[:200] for line in log.splitlines() if line.startswith("SKIPPED ")]
    scanned = cuda_marks.scan(REPO / "tests")
    marked = sum(test.marked for test in scanned)
    unmarked = [str(test) for test in cuda_marks.unmarked(scanned)]
    return dict(counts=counts, failed_tests=failed[:20], skipped_tests=skipped[:20], marked=marked, unmarked=unmarked)


def _now() -> float:
    import time

    return time.perf_counter()


if __name__ == "__main__":  # the data part's child: data WORK N_TRAIN N_VAL IMGSZ PROCESSES
    _, _, work, n_train, n_val, imgsz, processes = sys.argv
    make_side_data(Path(work), int(n_train), int(n_val), int(imgsz), int(processes))
