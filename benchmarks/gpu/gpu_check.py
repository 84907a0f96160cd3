"""One GPU check, for any GPU host (no network needed): issue 40's figures in one table and one JSON line.

Parts, each in a child process bounded by its own timeout and by the whole check's ``--budget``; a part that
fails (or has no time left) is a row ``failed: <reason>`` and the table is printed anyway:

1. train.py against YOLOv5 side by side (``--yolov5 DIR``; YOLOv5 at the same settings): yolov5s, 640 px,
   batch 64, ``--workers 8``, synthetic images of 480-640 px, ``--noval --nosave``, 4 epochs: the steady
   epoch (median of the epochs after the first), the first epoch, the whole run (wall, start-up included),
   the data wait. Our train.py runs once per row of :data:`CONFIGS` (the table to extend);
2. memory over epochs: ``train_one_epoch`` and ``evaluate`` as train.py runs them, allocated and reserved
   after each epoch (flat: within 2 % from epoch 2 on), then the final validation timed in the training
   precision and in fp32;
3. the CUDA tests (``python -m pytest -q -k cuda``);
4. ``benchmarks/gpu/gpu_step.py`` (model, step, loader and loop bounds);
5. the default job, ``python train.py --device 0``, with its mAP.

On a host without network, first put the wheels it lacks on PYTHONPATH (``shared/tools/gpu-wheels.sh``
says how); every child keeps the caller's PYTHONPATH (``benchmarks/child_env.py``).

Run:  python benchmarks/gpu/gpu_check.py --yolov5 ../yolov5                (about 8 minutes on one GPU)
      python benchmarks/gpu/gpu_check.py --cpu-smoke                       (every part, tiny, on the CPU)
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent  # benchmarks/gpu/: gpu_step
sys.path.insert(0, str(HERE.parent))  # benchmarks/: child_env
sys.path.insert(0, str(HERE.parent / "parity"))  # benchmarks/parity/: parity_record
sys.path.insert(0, str(REPO))
from child_env import with_pythonpath, without_checkout  # noqa: E402
from parity_record import yolov5_epoch_seconds  # noqa: E402

from ddp_utils.run.report import parse_epoch_lines  # noqa: E402

# our train.py configurations timed beside YOLOv5: (row name, extra train.py options); add rows here
CONFIGS = [
    ("ours: default (augment on the GPU, cuDNN heuristics)", []),
    ("ours: augment in the loader workers (OpenCV)", ["--augment-on", "workers"]),
    ("ours: cuDNN autotuned (on)", ["--cudnn-benchmark", "on"]),
    ("ours: cuDNN tuned ahead (warm)", ["--cudnn-benchmark", "warm"]),
    ("ours: cuDNN autotuned, limit 1", ["--cudnn-benchmark", "on", "--cudnn-benchmark-limit", "1"]),
]
FULL = dict(cfg="yolov5s.yaml", imgsz=640, batch=64, workers=8, epochs=4, images=960, memory_images=256,
            memory_epochs=10, val_images=200, device="0", budget=480)  # fmt: skip
SMOKE = dict(cfg="yolov5n.yaml", imgsz=64, batch=4, workers=0, epochs=2, images=8, memory_images=8,
             memory_epochs=3, val_images=4, device="cpu", budget=1500)  # fmt: skip
TIMEOUTS = dict(train=120, yolov5=120, memory=150, cuda_tests=150, gpu_step=120, default_job=150)
MAP = re.compile(r"mAP@0\.5 ([0-9.]+) mAP@0\.5:0\.95 ([0-9.]+)")
FLAT = 0.02  # allocated and reserved within 2 % from epoch 2 on


class PartFailed(RuntimeError):
    """A part that gave no figures: its message is the row's reason."""


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--yolov5", type=Path, help="a YOLOv5 v7.0 checkout: time it beside ours at the same settings")
    add("--yolov5-python", help="the interpreter for YOLOv5 (default: this one)")
    add("--cpu-smoke", action="store_true", help="every part at tiny sizes on the CPU: checks the check runs")
    add("--parts", nargs="+", default=["side", "memory", "cuda_tests", "gpu_step", "default_job"])
    add("--dir", type=Path, help="work directory (default: a temporary one, removed after)")
    add("--part", help=argparse.SUPPRESS)  # a child: "memory"
    for key, value in FULL.items():
        add(f"--{key.replace('_', '-')}", type=type(value), default=None, help=f"default {value} (smoke: {SMOKE[key]})")
    opt = parser.parse_args(argv)
    for key, value in (SMOKE if opt.cpu_smoke else FULL).items():
        if getattr(opt, key) is None:
            setattr(opt, key, value)
    return opt


# ---- running a child, bounded ----


def run_child(command: list[str], timeout: float, log: Path, cwd: Path = REPO, env: dict | None = None) -> str:
    """Run ``command`` to its end within ``timeout`` s (its whole process group killed after), its output to
    ``log``; returns the output. Raises PartFailed with the reason otherwise."""
    if timeout <= 1:
        raise PartFailed("no time left in the check's budget")
    with log.open("w") as out:
        proc = subprocess.Popen(
            command, cwd=cwd, env=env or with_pythonpath(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the loader's workers and torchrun's children too
            proc.wait()
            raise PartFailed(f"timed out after {timeout:.0f} s (log: {log})") from None
    text = log.read_text(errors="replace")
    if code != 0:
        last = [line.strip() for line in text.splitlines() if line.strip()][-1:] or ["no output"]
        raise PartFailed(f"exit {code}: {last[0][:160]}")
    return text


class Budget:
    """The check's deadline: each part gets its own timeout or what is left, whichever is less."""

    def __init__(self, seconds: float, slower: float = 1.0) -> None:
        self.end, self.slower = time.monotonic() + seconds, slower

    def timeout(self, part: str) -> float:
        return min(TIMEOUTS[part] * self.slower, self.end - time.monotonic())


# ---- the parts ----


def make_data(work: Path, opt: argparse.Namespace, n_train: int, n_val: int, name: str) -> Path:
    """Synthetic shapes of 3/4 to 1 x imgsz px (480-640 at 640), and its data yaml (ours and YOLOv5's)."""
    from ddp_utils.data.synthetic import DEFAULT_CLASSES, make_shapes_dataset

    root = make_shapes_dataset(work / name, n_train, n_val, size=(opt.imgsz * 3 // 4, opt.imgsz))
    names = "\n".join(f"  {i}: {cls}" for i, cls in enumerate(DEFAULT_CLASSES))
    data = work / f"{name}.yaml"
    data.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}\n")
    return data


def common(opt: argparse.Namespace, data: Path) -> list[str]:
    """The settings both train.py take, with the same meaning."""
    return [
        "--weights", "", "--data", str(data), "--imgsz", str(opt.imgsz), "--batch-size", str(opt.batch),
        "--workers", str(opt.workers), "--epochs", str(opt.epochs), "--device", opt.device,
        "--noval", "--nosave", "--noplots", "--exist-ok",
    ]  # fmt: skip


def epoch_figures(epoch_seconds: list[float], wall: float, data_wait: list[float] | None = None) -> dict:
    """Steady epoch (median after the first), first epoch, whole run, data wait (steady mean), from one run."""
    if not epoch_seconds:
        raise PartFailed("no epoch figures in its log")
    steady = epoch_seconds[1:] or epoch_seconds
    figures = dict(steady_epoch_s=statistics.median(steady), first_epoch_s=epoch_seconds[0], run_s=wall)
    figures["epochs_s"] = [round(s, 2) for s in epoch_seconds]
    if data_wait:
        figures["data_wait"] = statistics.fmean(data_wait[1:] or data_wait)
    return figures


def ours(opt: argparse.Namespace, work: Path, data: Path, name: str, extra: list[str], budget: Budget) -> dict:
    slug = re.sub(r"\W+", "_", name)
    command = [sys.executable, str(REPO / "train.py"), "--cfg", opt.cfg, *common(opt, data), "--progress", "off"]
    command += ["--project", str(work / "runs"), "--name", slug, *extra]
    start = time.perf_counter()
    log = run_child(command, budget.timeout("train"), work / f"{slug}.log")
    wall = time.perf_counter() - start
    epochs = parse_epoch_lines(log)
    return epoch_figures([opt.images / e["img_s"] for e in epochs], wall, [e["data_wait_share"] for e in epochs])


def yolov5(opt: argparse.Namespace, work: Path, data: Path, budget: Budget) -> dict:
    if opt.yolov5 is None:
        raise PartFailed("skipped: no --yolov5 DIR")
    fonts = work / "yolov5_config"  # YOLOv5 fetches Arial.ttf at start-up; offline, give it one
    fonts.mkdir(exist_ok=True)
    import matplotlib

    shutil.copy(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf", fonts / "Arial.ttf")
    env = without_checkout() | dict(YOLOV5_CONFIG_DIR=str(fonts), TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    command = [opt.yolov5_python or sys.executable, "train.py", "--cfg", f"models/{opt.cfg}", *common(opt, data)]
    command += ["--project", str(work / "yolov5"), "--name", "run"]
    start = time.perf_counter()
    log = run_child(command, budget.timeout("yolov5"), work / "yolov5.log", cwd=opt.yolov5.resolve(), env=env)
    return epoch_figures(yolov5_epoch_seconds(log), time.perf_counter() - start)


def memory(opt: argparse.Namespace, work: Path, budget: Budget) -> dict:
    """This script again as a child (``--part memory``): its last line is the figures."""
    command = [sys.executable, str(Path(__file__).resolve()), "--part", "memory", "--dir", str(work)]
    command += ["--cpu-smoke"] if opt.cpu_smoke else []
    command += [f"--{k.replace('_', '-')}={getattr(opt, k)}" for k in FULL if k != "budget"]
    log = run_child(command, budget.timeout("memory"), work / "memory.log")
    return json.loads(log.strip().splitlines()[-1].removeprefix("MEMORY "))


def cuda_tests(opt: argparse.Namespace, work: Path, budget: Budget) -> dict:
    command = [sys.executable, "-m", "pytest", "-q", "-k", "cuda", "-p", "no:cacheprovider"]
    command += ["--collect-only"] if opt.cpu_smoke else []  # the CPU has nothing to run them on: they must collect
    try:
        log = run_child(command, budget.timeout("cuda_tests"), work / "cuda_tests.log")
    except PartFailed as exc:
        text = (work / "cuda_tests.log").read_text(errors="replace") if (work / "cuda_tests.log").exists() else ""
        if "exit 1" not in str(exc):  # exit 1: some failed; the counts and names below say which
            raise
        log = text
    counts = {key: int(n) for n, key in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", log)}
    collected = re.search(r"(\d+)(?:/\d+)? tests? collected", log)  # "66/1396 tests collected": 66 chosen by -k
    if collected:
        counts["collected"] = int(collected.group(1))
    failed = [line.split()[1] for line in log.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return dict(counts=counts, failed=failed[:20])


def gpu_step(opt: argparse.Namespace, work: Path, budget: Budget) -> dict:
    command = [sys.executable, str(HERE / "gpu_step.py")]
    command += (
        ["--quick"] if opt.cpu_smoke else ["--device", opt.device, "--steps", "60", "--workers", str(opt.workers)]
    )
    log = run_child(command, budget.timeout("gpu_step"), work / "gpu_step.log")
    found = [line for line in log.splitlines() if line.startswith("RESULT ")]
    if not found:
        raise PartFailed("no RESULT line")
    figures = json.loads(found[-1].removeprefix("RESULT "))
    keep = ("model_img_s", "step_img_s", "loader_img_s")
    out = {key: figures.get(key) for key in keep}
    out["loop_img_s"] = figures.get("loop", {}).get("img_s")
    out["loop_data_wait"] = figures.get("loop", {}).get("data_wait_share")
    return out


def default_job(opt: argparse.Namespace, work: Path, budget: Budget) -> dict:
    command = [sys.executable, str(REPO / "train.py"), "--device", opt.device, "--progress", "off"]
    command += ["--project", str(work / "runs"), "--name", "default", "--exist-ok"]
    command += ["--epochs", "1", "--imgsz", "64", "--batch-size", "8", "--workers", "0"] if opt.cpu_smoke else []
    start = time.perf_counter()
    log = run_child(command, budget.timeout("default_job"), work / "default_job.log")
    found = MAP.findall(log)
    if not found:
        raise PartFailed("no mAP in its log")
    return dict(map50=float(found[-1][0]), map=float(found[-1][1]), run_s=time.perf_counter() - start)


# ---- memory over epochs (the child) ----


def memory_now(device: Any) -> tuple[int, int | None]:
    """(allocated, reserved) bytes on CUDA; on the CPU the bytes of live tensors' storages, and no reserve."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)  # a deliberate wait: this is a measurement
        return torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    gc.collect()
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in _live_tensors()}
    return sum(storages.values()), None


def _live_tensors() -> list:
    import warnings

    import torch

    with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated reduce_op warns
        warnings.simplefilter("ignore", FutureWarning)
        return [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor) and obj.device.type != "meta"]


def spread(values: list[int | None]) -> float | None:
    """(max - min) / min of the values from epoch 2 on; None without them."""
    later = [v for v in values[1:] if v is not None]
    return (max(later) - min(later)) / min(later) if later and min(later) > 0 else None


def memory_child(opt: argparse.Namespace) -> dict:
    """Epochs of train_one_epoch and evaluate as train.py runs them, memory after each; then the final validation,
    timed in the training precision and in fp32."""
    import torch

    from ddp_utils.data import DevicePrefetcher, create_val_dataloader, load_hyp
    from ddp_utils.engine import train_one_epoch
    from ddp_utils.yolo import evaluate

    spec = importlib.util.spec_from_file_location("gpu_step", HERE / "gpu_step.py")
    steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(steps)
    root = make_data(opt.dir, opt, opt.memory_images, opt.val_images, "memory_data").parent / "memory_data"
    sizes = ["--model", opt.cfg, "--imgsz", str(opt.imgsz), "--batch", str(opt.batch)]
    step_opt = steps.parse_opt([*sizes, "--workers", str(opt.workers), "--device", opt.device])
    device, hyp = steps.pick_device(step_opt.device), load_hyp("hyp.scratch-low.yaml")
    loader = steps.train_loader(step_opt, root / "images" / "train", hyp)
    step = steps.build(step_opt, device, hyp, len(loader))
    val_loader, _ = create_val_dataloader(root / "images" / "val", opt.imgsz, opt.batch * 2, 32, workers=opt.workers)
    half, used = step.amp != "off", []
    for epoch in range(opt.memory_epochs):
        loader.set_epoch(epoch)
        train_one_epoch(step, DevicePrefetcher(loader, device, step.channels_last), epoch, device)
        evaluate(step.ema.ema, val_loader, step.compute_loss, device=device, half=half, verbose=False)
        used.append(memory_now(device))
    allocated, reserved = [a for a, _ in used], [r for _, r in used]
    result = dict(allocated=allocated, reserved=reserved, spread_allocated=spread(allocated))
    result.update(spread_reserved=spread(reserved), val_images=len(val_loader.dataset))
    for name, precision in (("val_s_train_precision", half), ("val_s_fp32", False)):
        start = time.perf_counter()
        evaluate(step.ema.ema, val_loader, step.compute_loss, device=device, half=precision, verbose=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a deliberate wait: this is a measurement
        result[name] = time.perf_counter() - start
    result["nms_s"] = nms_seconds(step.ema.ema, val_loader, device, half)
    result["flat"] = all(s is None or s <= FLAT for s in (result["spread_allocated"], result["spread_reserved"]))
    return result


def nms_seconds(model: Any, loader: Any, device: Any, half: bool) -> float:
    """The final validation's NMS alone (its per-image loop), over the model's outputs for every batch: whether
    the loop shows beside the whole validation's time."""
    import torch

    from ddp_utils.yolo.ops import non_max_suppression

    total, model = 0.0, model.eval()
    autocast = torch.autocast(device.type, dtype=torch.float16, enabled=half and device.type == "cuda")
    for imgs, *_ in loader:
        with torch.no_grad(), autocast:
            pred = model(imgs.to(device).float() / 255)[0].float()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the forward done before the clock starts
        start = time.perf_counter()
        non_max_suppression(pred, 0.001, 0.6, multi_label=True, max_det=300)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a deliberate wait: this is a measurement
        total += time.perf_counter() - start
    return total


# ---- the report ----


def measure(name: str, part) -> tuple[str, dict | str]:
    """(name, figures), or (name, "failed: reason"); nothing a part raises stops the check."""
    start = time.perf_counter()
    try:
        figures = part()
    except PartFailed as exc:
        reason = str(exc)
        return name, reason if reason.startswith("skipped") else f"failed: {reason}"
    except Exception as exc:  # a bug in a part must not cost the others their rows
        return name, f"failed: {type(exc).__name__}: {exc}"
    print(f"gpu_check: {name}: done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return name, figures


def cell(value: Any, unit: str = "", scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:.{1 if unit != '%' else 0}f}{unit}"


def table(rows: list[tuple[str, dict | str]], images: int) -> str:
    lines = [
        "| part | steady epoch | img/s | first epoch | whole run | data wait | more |",
        "|---|---|---|---|---|---|---|",
    ]
    timed = ("steady_epoch_s", "first_epoch_s", "run_s", "data_wait", "epochs_s")
    for name, got in rows:
        if isinstance(got, str):
            lines.append(f"| {name} | {got} | | | | | |")
            continue
        steady = got.get("steady_epoch_s")
        rate = images / steady if steady and "first_epoch_s" in got else None
        more = ", ".join(f"{k} {json.dumps(v)}" for k, v in got.items() if k not in timed)
        row = [cell(steady, " s"), cell(rate), cell(got.get("first_epoch_s"), " s"), cell(got.get("run_s"), " s")]
        lines.append(f"| {name} | {' | '.join(row)} | {cell(got.get('data_wait'), '%', 100)} | {more} |")
    return "\n".join(lines)


def run_parts(opt: argparse.Namespace, work: Path) -> list[tuple[str, dict | str]]:
    budget, rows = Budget(opt.budget, slower=3.0 if opt.cpu_smoke else 1.0), []  # a shared 2-core CI host
    if "side" in opt.parts:
        data = make_data(work, opt, opt.images, max(opt.images // 8, 2), "side_data")
        (first, extra), *others = CONFIGS
        rows.append(measure(first, lambda: ours(opt, work, data, first, extra, budget)))
        rows.append(measure("YOLOv5 v7.0 train.py", lambda: yolov5(opt, work, data, budget)))
    parts = dict(memory=memory, cuda_tests=cuda_tests)
    rows += [
        measure(name, lambda part=part: part(opt, work, budget)) for name, part in parts.items() if name in opt.parts
    ]
    if "side" in opt.parts:
        rows += [measure(name, lambda n=name, x=extra: ours(opt, work, data, n, x, budget)) for name, extra in others]
    parts = dict(gpu_step=gpu_step, default_job=default_job)
    rows += [
        measure(name, lambda part=part: part(opt, work, budget)) for name, part in parts.items() if name in opt.parts
    ]
    return rows


def describe_device(opt: argparse.Namespace) -> str:
    import torch

    if opt.cpu_smoke or not torch.cuda.is_available():
        return f"CPU ({os.cpu_count()} cores), torch {torch.__version__}"
    name = torch.cuda.get_device_name(int(opt.device) if opt.device.isdigit() else 0)
    return f"{name}, {os.cpu_count()} cores, torch {torch.__version__}"


def main(argv: list[str] | None = None) -> dict:
    opt = parse_opt(argv)
    if opt.part == "memory":
        print("MEMORY " + json.dumps(memory_child(opt)))
        return {}
    work = (opt.dir or Path(tempfile.mkdtemp(prefix="gpu_check_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        rows = run_parts(opt, work)
    finally:
        if opt.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    device = describe_device(opt)
    setting = f"{opt.cfg} {opt.imgsz} px, batch {opt.batch}, --workers {opt.workers}, {opt.epochs} epochs"
    print(f"\ngpu_check on {device}: {setting}, {opt.images} images of {opt.imgsz * 3 // 4}-{opt.imgsz} px\n")
    print(table(rows, opt.images))
    result = dict(
        device=device, setting=setting, rows={n: g if isinstance(g, dict) else {g.split(":")[0]: g} for n, g in rows}
    )
    print("GPU_CHECK " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
