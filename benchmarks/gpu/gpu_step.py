"""How close does the training loop come to the card's own speed? Figures from the code train.py runs.

1. model: forward + backward on random tensors (AMP on CUDA, channels_last on CUDA), no loss:
   the model's own bound;
2. step: :class:`~ddp_utils.engine.TrainStep` (ComputeLoss, GradScaler, the fused optimizer,
   clipping, EMA) on one random batch, repeated; plus one instrumented pass that times each part;
3. loader: ``create_dataloader`` wrapped in :class:`~ddp_utils.data.DevicePrefetcher` alone, on a
   generated shapes set (mosaic, batch): the data bound;
4. loop: :func:`~ddp_utils.engine.train_one_epoch` over that prefetched loader, as train.py calls it
   (the model wrapped by ``wrap_model``, warm-up, a StepControl asked after each step);
5. ddp: the same loop in one process under ``torchrun --nproc_per_node 1``: the DDP wrapper, the
   preemption poll and NCCL (gloo on the CPU) in the loop;
6. train.py itself as a subprocess (``--train-py``), its epoch lines parsed.

cuDNN runs as train.py's ``--cudnn-benchmark`` sets it (default off: heuristics; ``on``: autotuned in the
untimed warm-up steps). Each of (4)-(6) reports its
steady state (the epochs after the first). It prints img/s of each, (4) / min((2), (3)), the
data wait of (4) and (5), and the share of (2) spent outside the model; the last line is
``RESULT {json}`` for scripts.

Without CUDA it says so in one line and measures with the ``--quick`` sizes (a 20 GB
yolov5s/640/64 step on a CPU helps nobody).

Run:  python benchmarks/gpu/gpu_step.py --model yolov5s.yaml --imgsz 640 --batch 64 --device 0
      python benchmarks/gpu/gpu_step.py --quick            (CPU, tiny: checks that it all runs)
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: child_env
from child_env import with_pythonpath  # noqa: E402  (children keep the caller's PYTHONPATH)

sys.path.insert(0, str(REPO))

import ddp_utils as du  # noqa: E402
from ddp_utils.data import DevicePrefetcher, augment_place, create_dataloader, load_hyp  # noqa: E402
from ddp_utils.data.synthetic import DEFAULT_CLASSES, make_shapes_dataset  # noqa: E402
from ddp_utils.engine import (  # noqa: E402
    CUDNN_MODES,
    ModelEMA,
    TrainStep,
    Warmup,
    accumulate_steps,
    lr_lambda,
    resolve_amp,
    set_cudnn_tuning,
    smart_optimizer,
    train_one_epoch,
    wrap_model,
)
from ddp_utils.engine.memory_format import to_channels_last, use_channels_last  # noqa: E402
from ddp_utils.run import StepControl  # noqa: E402
from ddp_utils.run.report import EPOCH_LINE  # noqa: E402  (train.py's epoch line, one home)
from ddp_utils.yolo import ComputeLoss, Model, scale_loss_gains  # noqa: E402

SPEED = re.compile(r"([0-9.]+) img/s, data wait ([0-9.]+)%")
MODES = ("model", "step", "loader", "loop", "ddp")
QUICK = {"model": "yolov5n.yaml", "imgsz": 32, "batch": 2, "steps": 2, "warmup": 1, "workers": 0, "images": 8}


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--model", default="yolov5s.yaml")
    add("--imgsz", type=int, default=640)
    add("--batch", type=int, default=64)
    add("--steps", type=int, default=300, help="timed steps of (1)-(3); about this many loop steps in (4)-(6)")
    add("--warmup", type=int, default=10, help="untimed steps first (cuDNN autotuning, allocator)")
    add("--device", default="", help="cuda index, 'cpu'; default: cuda:0 if there is one")
    add("--workers", type=int, default=8)
    add("--images", type=int, default=2000, help="training images generated for (3)-(6)")
    add("--modes", nargs="+", default=list(MODES), choices=MODES, help="what to measure")
    add("--train-py", action="store_true", help="also run train.py itself (6)")
    add("--quick", action="store_true", help="CPU, yolov5n at 32 px, batch 2, a few steps: a smoke run")
    add("--cudnn-benchmark", default="off", choices=CUDNN_MODES, help="as train.py's (warm: as on here)")
    add("--augment-on", default="auto", choices=["auto", "workers", "device"], help="as train.py's (auto: the "
        "device on CUDA)")  # fmt: skip
    add("--ddp-worker", help=argparse.SUPPRESS)  # the data yaml, in the process torchrun starts for (5)
    opt = parser.parse_args(argv)
    if not opt.quick and opt.device != "cpu" and not torch.cuda.is_available():
        print(f"gpu_step: no CUDA device here (torch {torch.__version__}); measuring on the CPU with --quick sizes")
        opt.quick = True
    if opt.quick:
        vars(opt).update(QUICK, device="cpu")
    return opt


def pick_device(name: str) -> torch.device:
    if name == "cpu" or (not name and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", int(name) if name.isdigit() else 0)


def sync(device: torch.device) -> float:
    """A timestamp after the device has finished (a deliberate wait: this is a measurement)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def build(opt: argparse.Namespace, device: torch.device, hyp: dict, nb: int = 1, distributed: bool = False):
    """The TrainStep as train.py builds it: memory format, fused optimizer, EMA, scaled loss, wrap_model, warm-up."""
    set_cudnn_tuning(getattr(opt, "cudnn_benchmark", "off"))  # as train.py without --deterministic
    torch.manual_seed(0)
    model = Model(opt.model, nc=len(DEFAULT_CLASSES)).to(device).train()
    channels_last = use_channels_last(device)
    if channels_last:
        to_channels_last(model)
    amp = resolve_amp(None, device)
    accumulate = accumulate_steps(opt.batch)
    optimizer = smart_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
    ema = ModelEMA(model)
    loss_hyp = scale_loss_gains(hyp, model.model[-1].nl, len(DEFAULT_CLASSES), opt.imgsz)
    compute_loss = ComputeLoss(model, loss_hyp)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    world = du.get_world_size()
    model = wrap_model(model, device, distributed=distributed)
    lf = lr_lambda(hyp["lrf"], 3)
    warmup = Warmup(
        optimizer, lf, nb, hyp["warmup_epochs"], hyp["warmup_bias_lr"], hyp["warmup_momentum"], hyp["momentum"], 1
    )
    return TrainStep(model, optimizer, scaler, ema, compute_loss, accumulate, warmup, amp, world, None, channels_last)


def random_batch(opt: argparse.Namespace, device: torch.device, per_image: int = 8):
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (opt.batch, 3, opt.imgsz, opt.imgsz), generator=gen, dtype=torch.uint8)
    n = opt.batch * per_image
    targets = torch.cat(
        (
            torch.arange(opt.batch).repeat_interleave(per_image)[:, None].float(),
            torch.randint(0, len(DEFAULT_CLASSES), (n, 1), generator=gen).float(),
            torch.rand(n, 2, generator=gen) * 0.8 + 0.1,
            torch.rand(n, 2, generator=gen) * 0.3 + 0.02,
        ),
        1,
    )
    return images.to(device), targets.to(device)


def model_only(opt, device, hyp) -> float:
    """(1) img/s of forward + backward alone."""
    step = build(opt, device, hyp)
    images, _ = random_batch(opt, device)
    images = step.prepare(images, device)
    for i in range(opt.warmup + opt.steps):
        if i == opt.warmup:
            start = sync(device)
        with torch.autocast(
            device.type, enabled=step.amp != "off", dtype=torch.float16 if step.amp == "fp16" else torch.bfloat16
        ):
            outputs = step.model(images)
        sum(o.float().mean() for o in outputs).backward()
    return opt.batch * opt.steps / (sync(device) - start)


def full_step(opt, device, hyp) -> tuple[float, dict]:
    """(2) img/s of TrainStep on one batch, and ms per part from one instrumented pass (waits between parts)."""
    step = build(opt, device, hyp)
    images, targets = random_batch(opt, device)
    images = step.prepare(images, device)
    for i in range(opt.warmup):
        step(images, targets, i, 0)
    start = sync(device)
    for i in range(opt.steps):
        step(images, targets, opt.warmup + i, 0)
    rate = opt.batch * opt.steps / (sync(device) - start)
    return rate, instrumented_parts(step, images, targets, device, max(3, min(opt.steps, 20)))


def instrumented_parts(step: TrainStep, images, targets, device, repeats: int) -> dict:
    """ms per part of TrainStep's work, each part closed by a device sync (so: an upper bound per part)."""
    parts = dict.fromkeys(("forward", "loss", "backward", "optimizer", "ema"), 0.0)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(step.amp)
    for _ in range(repeats):
        marks = [sync(device)]
        with torch.autocast(device.type, enabled=dtype is not None, dtype=dtype or torch.float32):
            outputs = step.model(images)
            marks.append(sync(device))
            loss, _ = step.compute_loss(outputs, targets)
        marks.append(sync(device))
        step.scaler.scale(loss).backward()
        marks.append(sync(device))
        step.scaler.unscale_(step.optimizer)
        torch.nn.utils.clip_grad_norm_(step.model.parameters(), max_norm=step.max_grad_norm)
        step.scaler.step(step.optimizer)
        step.scaler.update()
        step.optimizer.zero_grad()
        marks.append(sync(device))
        step.ema.update(step.model)
        marks.append(sync(device))
        for name, t0, t1 in zip(parts, marks, marks[1:]):
            parts[name] += (t1 - t0) * 1000
    return {name: ms / repeats for name, ms in parts.items()}


def train_loader(opt, train_dir: Path, hyp, rank: int = -1):
    where = augment_place(opt.augment_on, pick_device(opt.device))  # the device path decodes and augments there
    kwargs = dict(hyp=hyp, augment=True, workers=opt.workers, shuffle=True, rank=rank, augment_on=where)
    loader, _ = create_dataloader(train_dir, opt.imgsz, opt.batch, 32, **kwargs)
    return loader


def loader_alone(opt, train_dir: Path, hyp, device: torch.device) -> float:
    """(3) img/s of the training loader and the prefetcher's copy to the device, mosaic on, nothing else."""
    loader = train_loader(opt, train_dir, hyp)
    channels_last = use_channels_last(device)
    taken, start, epoch = 0, None, 0
    wanted = opt.warmup + opt.steps
    while taken < wanted:
        loader.set_epoch(epoch) if hasattr(loader, "set_epoch") else None
        for _ in DevicePrefetcher(loader, device, channels_last):
            taken += 1
            if taken == min(opt.warmup, wanted - 1):
                start = sync(device)
            if taken >= wanted:
                break
        epoch += 1
    start = start if start is not None else time.perf_counter()
    timed = taken - min(opt.warmup, wanted - 1)
    rate = opt.batch * timed / max(sync(device) - start, 1e-9)
    close = getattr(loader, "close", None)
    if close:
        close()
    return rate


def epochs_for(opt, nb: int) -> int:
    return max(2, round(opt.steps / max(nb, 1)) + 1)


def loop(opt, device: torch.device, train_dir: Path, hyp, distributed: bool = False) -> dict:
    """(4)/(5) train_one_epoch over the prefetched loader, as train.py runs it; the epochs after the first."""
    rank = du.dist_info().local_rank if distributed else -1
    loader = train_loader(opt, train_dir, hyp, rank)
    nb = len(loader)
    step = build(opt, device, hyp, nb, distributed)
    epochs, speeds = epochs_for(opt, nb), []
    with StepControl() as control:
        for epoch in range(epochs):
            loader.set_epoch(epoch) if hasattr(loader, "set_epoch") else None
            batches = DevicePrefetcher(loader, device, step.channels_last)
            stats = train_one_epoch(step, batches, epoch, device, nb=nb, epochs=epochs, control=control)
            speeds.append(stats.speed(du.get_world_size()))
    close = getattr(loader, "close", None)
    if close:
        close()
    steady = [tuple(map(float, SPEED.search(s).groups())) for s in speeds[1:]]
    return {
        "epochs": epochs,
        "steps": epochs * nb,
        "per_epoch": speeds,
        "img_s": sum(r for r, _ in steady) / len(steady),
        "data_wait_share": sum(w for _, w in steady) / len(steady) / 100,
    }


def ddp_loop(opt, data_yaml: Path) -> dict:
    """(5) the loop under ``torchrun --nproc_per_node 1``: this script again, as its worker."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_addr", "127.0.0.1",
        "--master_port", str(port), str(Path(__file__).resolve()), "--ddp-worker", str(data_yaml),
        *("--model", opt.model, "--imgsz", str(opt.imgsz), "--batch", str(opt.batch), "--steps", str(opt.steps)),
        *("--warmup", str(opt.warmup), "--workers", str(opt.workers), "--device", opt.device or "0"),
        *("--cudnn-benchmark", opt.cudnn_benchmark, "--augment-on", opt.augment_on),
    ]  # fmt: skip
    env = with_pythonpath()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("DDP_RESULT ")]
    if done.returncode != 0 or not lines:
        return {"error": f"torchrun exited {done.returncode}: {(done.stdout + done.stderr).strip().splitlines()[-3:]}"}
    return json.loads(lines[-1].removeprefix("DDP_RESULT "))


def ddp_worker(opt) -> None:
    device = pick_device(opt.device)
    du.init_distributed(device=device)
    hyp = load_hyp("hyp.scratch-low.yaml")
    train_dir = Path(opt.ddp_worker).parent / "shapes" / "images" / "train"
    result = loop(opt, device, train_dir, hyp, distributed=True)
    result["backend"] = torch.distributed.get_backend()
    print("DDP_RESULT " + json.dumps(result), flush=True)
    du.cleanup()


def parse_train_log(text: str) -> list[dict]:
    """Per-epoch figures from train.py's epoch lines, whose ending is stable: ``N img/s, data wait P%``.

    Examples:
        >>> parse_train_log("epoch 2/3: loss 0.1 0.2 0.3, P 0.5 R 0.5 mAP@0.5 0.4, 312.5 img/s, data wait 4.0%")
        [{'epoch': 2, 'img_s': 312.5, 'data_wait_share': 0.04}]
    """
    return [
        {"epoch": int(m.group(1)), "img_s": float(m.group(2)), "data_wait_share": float(m.group(3)) / 100}
        for m in EPOCH_LINE.finditer(text)
    ]


def train_script(opt, data_yaml: Path, n_images: int, workdir: Path) -> dict:
    """(4) train.py for about ``opt.steps`` steps; the steady state is the mean over epochs after the first."""
    steps_per_epoch = max(n_images // opt.batch, 1)
    epochs = max(2, round(opt.steps / steps_per_epoch))
    command = [
        sys.executable,
        str(REPO / "train.py"),
        *("--cfg", opt.model, "--data", str(data_yaml), "--imgsz", str(opt.imgsz)),
        *("--batch-size", str(opt.batch), "--epochs", str(epochs), "--workers", str(opt.workers)),
        *("--device", "cpu" if opt.device == "cpu" else (opt.device or "0")),
        *("--noval", "--nosave", "--exist-ok", "--project", str(workdir / "runs"), "--name", "gpu_step"),
        *("--cudnn-benchmark", opt.cudnn_benchmark, "--augment-on", opt.augment_on),
    ]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    text = done.stdout + done.stderr
    if done.returncode != 0:
        return {"error": f"train.py exited {done.returncode}: {text.strip().splitlines()[-3:]}", "wall_s": wall}
    parsed = parse_train_log(text)
    steady = [e for e in parsed if e["epoch"] > 1] or parsed
    result: dict = {"epochs": epochs, "steps": epochs * steps_per_epoch, "wall_s": wall, "parsed": parsed}
    rates = [e["img_s"] for e in steady if "img_s" in e]
    if rates:
        result["img_s"] = sum(rates) / len(rates)
    if steady:
        result["data_wait_share"] = sum(e["data_wait_share"] for e in steady) / len(steady)
    return result


def make_data(root: Path, n_images: int, imgsz: int) -> Path:
    side = max(imgsz * 3 // 4, 32)
    make_shapes_dataset(root / "shapes", n_images, max(n_images // 8, 2), size=(side, imgsz))
    yaml = root / "shapes.yaml"
    names = "\n".join(f"  {i}: {name}" for i, name in enumerate(DEFAULT_CLASSES))
    yaml.write_text(f"path: {root / 'shapes'}\ntrain: images/train\nval: images/val\nnames:\n{names}\n")
    return yaml


def report(opt, device, figures: dict) -> None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"\n{opt.model} {opt.imgsz}px batch {opt.batch} on {name} ({opt.steps} steps, workers {opt.workers})\n")
    print("| measured | img/s | data wait |\n|---|---|---|")
    rows = [
        ("(1) model only, forward + backward", figures.get("model_img_s"), None),
        ("(2) TrainStep on one batch", figures.get("step_img_s"), None),
        ("(3) loader + DevicePrefetcher alone", figures.get("loader_img_s"), None),
    ]
    for key, label in (("loop", "(4) train_one_epoch, steady state"), ("ddp", "(5) the same under torchrun, DDP")):
        rows.append((label, figures.get(key, {}).get("img_s"), figures.get(key, {}).get("data_wait_share")))
    rows.append(
        (
            "(6) train.py, steady state",
            figures.get("train", {}).get("img_s"),
            figures.get("train", {}).get("data_wait_share"),
        )
    )
    for label, rate, wait in rows:
        if rate is not None:
            print(f"| {label} | {rate:.1f} | {'' if wait is None else f'{wait:.1%}'} |")
    if "step_img_s" in figures and "loader_img_s" in figures:
        bound = min(figures["step_img_s"], figures["loader_img_s"])
        for key in ("loop", "ddp", "train"):
            if "img_s" in figures.get(key, {}):
                figures[f"{key}_over_bound"] = figures[key]["img_s"] / bound
                print(f"({key}) / min((2), (3)) = {figures[f'{key}_over_bound']:.2f}")
    parts = figures.get("step_parts_ms")
    if parts:
        figures["outside_model_share"] = (parts["loss"] + parts["optimizer"] + parts["ema"]) / max(
            sum(parts.values()), 1e-9
        )
        print(
            "(2) per step, ms: "
            + ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
            + f"; loss + optimizer + EMA = {figures['outside_model_share']:.1%} of the step (a sync after each part)"
        )
    for key in ("ddp", "train"):
        if "error" in figures.get(key, {}):
            print(f"({key}) failed: {figures[key]['error']}")
    print("RESULT " + json.dumps(figures, default=str))


def main(argv: list[str] | None = None) -> dict:
    opt = parse_opt(argv)
    if opt.ddp_worker:
        ddp_worker(opt)
        return {}
    device = pick_device(opt.device)
    hyp = load_hyp("hyp.scratch-low.yaml")
    figures: dict = {"device": str(device), "quick": opt.quick}
    if "model" in opt.modes:
        figures["model_img_s"] = model_only(opt, device, hyp)
    if "step" in opt.modes:
        figures["step_img_s"], figures["step_parts_ms"] = full_step(opt, device, hyp)
    with tempfile.TemporaryDirectory(prefix="gpu_step_") as tmp:
        data_yaml = make_data(Path(tmp), opt.images, opt.imgsz)
        train_dir = Path(tmp) / "shapes" / "images" / "train"
        if "loader" in opt.modes:
            figures["loader_img_s"] = loader_alone(opt, train_dir, hyp, device)
        if "loop" in opt.modes:
            figures["loop"] = loop(opt, device, train_dir, hyp)
        if "ddp" in opt.modes:
            figures["ddp"] = ddp_loop(opt, data_yaml)
        if opt.train_py:
            figures["train"] = train_script(opt, data_yaml, opt.images, Path(tmp))
    report(opt, device, figures)
    return figures


if __name__ == "__main__":
    main()
