"""How close does train.py come to the card's own speed? Four figures from one run.

1. model: forward + backward on random tensors (AMP on CUDA, the memory format train.py
   uses: ``channels_last`` on CUDA), no loss: the model's own bound;
2. step: the full training step on random tensors and targets: ComputeLoss, GradScaler,
   gradient clipping, SGD, EMA; plus one instrumented pass that times each part, so the
   share of ComputeLoss + EMA + optimizer in the step is known;
3. loader: ``create_dataloader`` alone on a generated shapes set (mosaic, batch);
4. train.py: the real script as a subprocess on that set for about ``--steps`` steps; its
   per-epoch log lines are parsed (an ``img/s`` figure if it prints one, else the epoch's
   ``data Xs, compute Ys``), and the epochs after the first give its steady state.

It prints img/s of each, the ratio of (4) to min((2), (3)), the share of (4)'s step time
spent waiting for data, and the share of (2) spent in ComputeLoss + EMA + optimizer; the
last line is ``RESULT {json}`` for scripts.

Run:  python benchmarks/gpu_step.py --model yolov5s.yaml --imgsz 640 --batch 64 --steps 300 --device 0
      python benchmarks/gpu_step.py --quick            (CPU, tiny: checks that it all runs)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ddp_utils.data import create_dataloader, load_hyp  # noqa: E402
from ddp_utils.data.synthetic import DEFAULT_CLASSES, make_shapes_dataset  # noqa: E402
from ddp_utils.engine import ModelEMA, smart_optimizer  # noqa: E402
from ddp_utils.engine.memory_format import to_channels_last, use_channels_last  # noqa: E402
from ddp_utils.engine.run_report import EPOCH_LINE  # noqa: E402  (train.py's epoch line, one home)
from ddp_utils.yolo import ComputeLoss, Model  # noqa: E402


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--model", default="yolov5s.yaml")
    add("--imgsz", type=int, default=640)
    add("--batch", type=int, default=64)
    add("--steps", type=int, default=300, help="timed steps of (1)-(3); about this many train.py steps in (4)")
    add("--warmup", type=int, default=10, help="untimed steps first (cuDNN, allocator)")
    add("--device", default="", help="cuda index, 'cpu'; default: cuda:0 if there is one")
    add("--workers", type=int, default=8)
    add("--images", type=int, default=2000, help="training images generated for (3) and (4)")
    add("--quick", action="store_true", help="CPU, yolov5n at 64 px, batch 4, a few steps: a smoke run")
    add("--skip-train", action="store_true", help="leave out (4)")
    opt = parser.parse_args(argv)
    if opt.quick:
        opt.model, opt.imgsz, opt.batch, opt.steps, opt.warmup = "yolov5n.yaml", 32, 2, 2, 1
        opt.device, opt.workers, opt.images = "cpu", 0, 4
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


def build(opt: argparse.Namespace, device: torch.device, hyp: dict):
    """The model as train.py holds it: on the device, in its memory format, with its loss, optimizer and EMA."""
    torch.manual_seed(0)
    model = Model(opt.model, nc=len(DEFAULT_CLASSES)).to(device).train()
    if use_channels_last(device):
        to_channels_last(model)
    optimizer = smart_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
    return model, ComputeLoss(model, hyp), optimizer, ModelEMA(model)


def random_batch(opt: argparse.Namespace, device: torch.device, per_image: int = 8):
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(opt.batch, 3, opt.imgsz, opt.imgsz, generator=gen).to(device)
    if use_channels_last(device):
        images = images.contiguous(memory_format=torch.channels_last)
    n = opt.batch * per_image
    targets = torch.cat(
        (
            torch.arange(opt.batch).repeat_interleave(per_image)[:, None].float(),
            torch.randint(0, len(DEFAULT_CLASSES), (n, 1), generator=gen).float(),
            torch.rand(n, 2, generator=gen) * 0.8 + 0.1,
            torch.rand(n, 2, generator=gen) * 0.3 + 0.02,
        ),
        1,
    ).to(device)
    return images, targets


def model_only(opt, device, hyp) -> float:
    """(1) img/s of forward + backward alone."""
    model, *_ = build(opt, device, hyp)
    images, _ = random_batch(opt, device)
    cuda = device.type == "cuda"
    for i in range(opt.warmup + opt.steps):
        if i == opt.warmup:
            start = sync(device)
        with torch.autocast(device.type, enabled=cuda):
            outputs = model(images)
        sum(o.float().mean() for o in outputs).backward()
    return opt.batch * opt.steps / (sync(device) - start)


def full_step(opt, device, hyp) -> tuple[float, dict]:
    """(2) img/s of the whole step, and ms per part from one instrumented pass (waits between parts)."""
    model, compute_loss, optimizer, ema = build(opt, device, hyp)
    images, targets = random_batch(opt, device)
    cuda = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=cuda)
    parts = dict.fromkeys(("forward", "loss", "backward", "optimizer", "ema"), 0.0)

    def step(timed: bool) -> None:
        marks = [sync(device) if timed else 0.0]
        with torch.autocast(device.type, enabled=cuda):
            outputs = model(images)
            marks.append(sync(device) if timed else 0.0)
            loss, _ = compute_loss(outputs, targets)
        marks.append(sync(device) if timed else 0.0)
        scaler.scale(loss).backward()
        marks.append(sync(device) if timed else 0.0)
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        marks.append(sync(device) if timed else 0.0)
        ema.update(model)
        if timed:
            marks.append(sync(device))
            for name, t0, t1 in zip(parts, marks, marks[1:]):
                parts[name] += (t1 - t0) * 1000

    for _ in range(opt.warmup):
        step(False)
    start = sync(device)
    for _ in range(opt.steps):
        step(False)
    rate = opt.batch * opt.steps / (sync(device) - start)
    instrumented = max(3, min(opt.steps, 20))
    for _ in range(instrumented):
        step(True)
    return rate, {name: ms / instrumented for name, ms in parts.items()}


def loader_alone(opt, train_dir: Path, hyp) -> float:
    """(3) img/s of the training loader, mosaic on, nothing else."""
    loader, _ = create_dataloader(
        train_dir, opt.imgsz, opt.batch, 32, hyp=hyp, augment=True, workers=opt.workers, shuffle=True
    )
    batches, taken, start = iter(loader), 0, None
    wanted = opt.warmup + opt.steps
    epoch = 0
    while taken < wanted:
        try:
            next(batches)
        except StopIteration:
            epoch += 1
            loader.set_epoch(epoch)
            batches = iter(loader)
            continue
        taken += 1
        if taken == min(opt.warmup, wanted - 1):
            start = time.perf_counter()
    if start is None:
        start = time.perf_counter()
    timed = taken - min(opt.warmup, wanted - 1)
    rate = opt.batch * timed / max(time.perf_counter() - start, 1e-9)
    close = getattr(loader, "close", None)
    if close:
        close()
    return rate


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
    step_rate, loader_rate = figures["step_img_s"], figures["loader_img_s"]
    parts = figures["step_parts_ms"]
    tail = parts["loss"] + parts["optimizer"] + parts["ema"]
    figures["tail_share"] = tail / max(sum(parts.values()), 1e-9)
    train = figures.get("train", {})
    bound = min(step_rate, loader_rate)
    if "img_s" in train:
        figures["train_over_bound"] = train["img_s"] / bound
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"\n{opt.model} {opt.imgsz}px batch {opt.batch} on {name} ({opt.steps} steps, workers {opt.workers})\n")
    print("| measured | img/s |\n|---|---|")
    print(f"| (1) model only, forward + backward | {figures['model_img_s']:.1f} |")
    print(f"| (2) full step on random tensors | {step_rate:.1f} |")
    print(f"| (3) loader alone | {loader_rate:.1f} |")
    print(f"| (4) train.py, steady state | {train.get('img_s', float('nan')):.1f} |")
    print(f"\n(4) / min((2), (3)) = {figures.get('train_over_bound', float('nan')):.2f}")
    print(f"(4) share of step time waiting for data: {train.get('data_wait_share', float('nan')):.1%}")
    print(
        "(2) per step, ms: " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()) + f"; ComputeLoss + optimizer + "
        f"EMA = {figures['tail_share']:.1%} of the step (instrumented: waits between parts)"
    )
    if "error" in train:
        print(f"(4) failed: {train['error']}")
    elif train:
        print(f"(4) parsed from train.py's log: {train.get('parsed')}")
    print("RESULT " + json.dumps(figures, default=str))


def main(argv: list[str] | None = None) -> dict:
    opt = parse_opt(argv)
    device = pick_device(opt.device)
    hyp = load_hyp("hyp.scratch-low.yaml")
    figures: dict = {"device": str(device)}
    figures["model_img_s"] = model_only(opt, device, hyp)
    figures["step_img_s"], figures["step_parts_ms"] = full_step(opt, device, hyp)
    with tempfile.TemporaryDirectory(prefix="gpu_step_") as tmp:
        data_yaml = make_data(Path(tmp), opt.images, opt.imgsz)
        figures["loader_img_s"] = loader_alone(opt, Path(tmp) / "shapes" / "images" / "train", hyp)
        if not opt.skip_train:
            figures["train"] = train_script(opt, data_yaml, opt.images, Path(tmp))
    report(opt, device, figures)
    return figures


if __name__ == "__main__":
    main()
