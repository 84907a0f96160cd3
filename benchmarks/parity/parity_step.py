"""Our training step against YOLOv5's, step by step: same initial weights, same batches.

    python benchmarks/parity/parity_step.py --yolov5 ../yolov5 --yolov5-python ../yolov5-venv/bin/python
        [--n-train 256] [--imgsz 160] [--batch-size 16] [--epochs 2] [--seed 0] [--dir runs/parity_step]

What ``parity.py`` cannot separate, this does. Our loader makes every batch of
``--epochs`` epochs once (mosaic and all, from ``--seed``) and our model its initial weights (the
head's biases set as our train.py sets them); both go to a file. Then each trainer's own pieces
train from those weights on those batches, in its own process and interpreter: ours are what our
train.py builds (``optimizer_from_hyp``'s optimizer, LR schedule, warm-up and accumulation,
``ModelEMA``, ``ComputeLoss`` with ``scale_loss_gains``, ``TrainStep``); YOLOv5's are its
``models.yolo.Model``, ``utils.loss.ComputeLoss``, ``utils.torch_utils.smart_optimizer`` and
``ModelEMA``, driven the way its train.py drives them (its hyp scaling, nbs 64, the warm-up
interpolation of lr, momentum and accumulation, gradient clipping at 10, the LambdaLR step per epoch).
Nothing of YOLOv5 is imported into this process: its side runs as ``<yolov5-python> parity_step.py
--yolov5-side DIR`` with the checkout as its working directory, and both sides exchange tensors only.

Printed, as relative norms of the difference ``||ours - yolov5|| / ||yolov5||`` over all
floating-point tensors (and the worst tensor's ``max|diff| / max|yolov5|``):

- the first batch: the loss items; the gradients at the first optimizer step; the parameters after
  it; the EMA after it;
- every batch's loss items (the largest relative difference, and when it first exceeds 1e-3);
- the weights and the EMA after all batches.

Then what differs in what each builds before training, which the shared weights hide: YOLOv5's
freshly built model against ours (the head's objectness and class biases per level, BatchNorm eps and
momentum, the spread of the convolution weights), and YOLOv5's train.py rounding every weight to fp16
before training (``model.half().float()``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: child_env
from child_env import without_checkout  # noqa: E402  (children keep the caller's PYTHONPATH)

NBS = 64  # YOLOv5's train.py hard-codes it; the hyp given to ours says so too
NUDGE = 1e-7  # about one float32 rounding: the relative change of every initial weight in the noise-floor run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--yolov5", type=Path, help="an ultralytics/yolov5 checkout (v7.0)")
    add("--yolov5-python", default=None, help="the interpreter that runs YOLOv5 (its own venv); default: this one")
    add("--yolov5-side", type=Path, help=argparse.SUPPRESS)  # internal: run YOLOv5's side on this exchange dir
    add("--n-train", type=int, default=256)
    add("--imgsz", type=int, default=160)
    add("--batch-size", type=int, default=16)
    add("--epochs", type=int, default=2)
    add("--seed", type=int, default=0)
    add("--cfg", default="yolov5n.yaml")
    add("--hyp", default="hyp.shapes.yaml", help="hyp yaml; nbs is set to 64, warmup_min_iters to 100")
    add("--dir", type=Path, default=REPO / "runs" / "parity_step")
    args = parser.parse_args(argv)
    if args.yolov5_side is None:
        if args.yolov5 is None or not (args.yolov5 / "train.py").is_file():
            parser.error(f"--yolov5 {args.yolov5}: give an ultralytics/yolov5 checkout (a folder with train.py)")
        if args.n_train < args.batch_size or args.epochs < 1:
            parser.error("--n-train must be at least --batch-size, --epochs at least 1")
    return args


# ---- shared: comparing tensors ----


def relative_difference(ours: dict, theirs: dict) -> tuple[float, float, str]:
    """(||ours - theirs|| / ||theirs|| over every common float tensor, the worst tensor's max ratio, its name)."""
    num = den = 0.0
    worst, where = 0.0, ""
    for key, b in theirs.items():
        a = ours.get(key)
        if a is None or not b.is_floating_point():
            continue
        a, b = a.double(), b.double()
        num += float((a - b).pow(2).sum())
        den += float(b.pow(2).sum())
        scale = float(b.abs().max()) if b.numel() else 0.0
        ratio = float((a - b).abs().max()) / scale if scale > 0 else float((a - b).abs().max())
        if ratio > worst:
            worst, where = ratio, key
    return math.sqrt(num / den) if den > 0 else math.sqrt(num), worst, where


# ---- YOLOv5's side: run by YOLOv5's interpreter in its checkout ----


def yolov5_side(exchange: Path) -> None:
    """Train YOLOv5's pieces on the shared weights and batches, the way its train.py drives them."""
    import numpy as np
    import torch

    sys.path.insert(0, os.getcwd())  # the YOLOv5 checkout: its models/ and utils/
    from models.yolo import Model  # noqa: I001 - YOLOv5's modules, found in its checkout only
    from utils.loss import ComputeLoss
    from utils.torch_utils import ModelEMA, smart_optimizer

    setup = json.loads((exchange / "setup.json").read_text())
    hyp = dict(setup["hyp"])
    shared = torch.load(exchange / "shared.pt", weights_only=True)
    torch.manual_seed(setup["seed"])
    model = Model(setup["cfg_path"], ch=3, nc=setup["nc"])
    fresh = {k: v.detach().clone() for k, v in model.state_dict().items()}
    bn = [(m.eps, m.momentum) for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    missing, unexpected = model.load_state_dict(shared["init"], strict=False)
    batch_size, epochs, batches = setup["batch_size"], setup["epochs"], shared["batches"]
    nb = len(batches) // epochs
    # train.py, in its order: accumulation to nbs, the scaled weight decay, the optimizer, LambdaLR, EMA
    accumulate = max(round(NBS / batch_size), 1)
    hyp["weight_decay"] *= batch_size * accumulate / NBS
    optimizer = smart_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
    lf = lambda x: (1 - x / epochs) * (1.0 - hyp["lrf"]) + hyp["lrf"]  # noqa: E731 - its linear schedule
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lf)
    ema = ModelEMA(model)
    nl = model.model[-1].nl
    hyp["box"] *= 3 / nl
    hyp["cls"] *= setup["nc"] / 80 * 3 / nl
    hyp["obj"] *= (setup["imgsz"] / 640) ** 2 * 3 / nl
    hyp["label_smoothing"] = 0.0
    model.nc, model.hyp = setup["nc"], hyp
    compute_loss = ComputeLoss(model)
    nw = max(round(hyp["warmup_epochs"] * nb), 100)
    record = _Recorder(model, ema)
    optimizer.register_step_pre_hook(record.grads_at_first_step)
    last_opt_step = -1
    scheduler.last_epoch = -1
    for epoch in range(epochs):
        model.train()
        optimizer.zero_grad()
        for i in range(nb):
            imgs, targets = batches[epoch * nb + i]
            ni = i + nb * epoch
            imgs = imgs.float() / 255
            if ni <= nw:
                accumulate = max(1, np.interp(ni, [0, nw], [1, NBS / batch_size]).round())
                for j, group in enumerate(optimizer.param_groups):
                    start = hyp["warmup_bias_lr"] if j == 0 else 0.0
                    group["lr"] = np.interp(ni, [0, nw], [start, group["initial_lr"] * lf(epoch)])
                    group["momentum"] = np.interp(ni, [0, nw], [hyp["warmup_momentum"], hyp["momentum"]])
            loss, loss_items = compute_loss(model(imgs), targets)
            loss.backward()
            record.losses.append(loss_items.detach().clone())
            if ni - last_opt_step >= accumulate:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
                optimizer.step()
                optimizer.zero_grad()
                ema.update(model)
                record.after_step()
                last_opt_step = ni
        scheduler.step()
    torch.save(
        dict(
            record.result(),
            fresh=fresh,
            bn=torch.tensor(bn, dtype=torch.float64),
            missing=list(missing),
            unexpected=list(unexpected),
        ),
        exchange / "yolov5.pt",
    )


class _Recorder:
    """The first optimizer step's gradients, the weights and EMA after it, every batch's loss items, the end."""

    def __init__(self, model: Any, ema: Any) -> None:
        self.model, self.ema = model, ema
        self.losses: list[Any] = []
        self.grads: dict | None = None
        self.first: dict | None = None
        self.steps = 0

    def grads_at_first_step(self, optimizer: Any, *_: Any) -> None:
        if self.grads is None:
            self.grads = {
                name: p.grad.detach().clone() for name, p in self.model.named_parameters() if p.grad is not None
            }

    def after_step(self) -> None:
        self.steps += 1
        if self.first is None:
            self.first = dict(model=_state(self.model), ema=_state(self.ema.ema))

    def result(self) -> dict:
        import torch

        return dict(
            losses=torch.stack(self.losses),
            grads=self.grads,
            first=self.first,
            final=dict(model=_state(self.model), ema=_state(self.ema.ema)),
            steps=self.steps,
        )


def _state(module: Any) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# ---- our side ----


def prepare(args: argparse.Namespace) -> tuple[Path, dict]:
    """The dataset, our initial weights and every batch of the run, written for both sides."""
    import torch

    import ddp_utils as du
    from ddp_utils.data import class_frequency, create_dataloader
    from ddp_utils.data.synthetic import DEFAULT_CLASSES, make_shapes_dataset
    from ddp_utils.hyp import load_hyp
    from ddp_utils.yolo import Model
    from ddp_utils.yolo.finetune import grid_size

    work = args.dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    root = work / "shapes"
    if not (root / "shapes.json").is_file():
        make_shapes_dataset(root, args.n_train, 1, (args.imgsz, args.imgsz * 8 // 5), seed=0)
    hyp = load_hyp(args.hyp)
    hyp.update(nbs=NBS, warmup_min_iters=100)
    nc = len(DEFAULT_CLASSES)
    du.init_seeds(args.seed)
    model = Model(args.cfg, nc=nc)
    loader, dataset = create_dataloader(
        root / "images" / "train", args.imgsz, args.batch_size, grid_size(model), hyp=hyp, augment=True,
        workers=0, shuffle=True, seed=args.seed,
    )  # fmt: skip
    model.initialize_biases(class_frequency(dataset.labels, nc))  # as train.py's build_training does
    batches = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        batches += [(imgs, targets) for imgs, targets, _, _ in loader]
    setup = dict(
        hyp=hyp, seed=args.seed, nc=nc, imgsz=args.imgsz, batch_size=args.batch_size, epochs=args.epochs,
        cfg_path=str((args.yolov5 / "models" / args.cfg).resolve()),
    )  # fmt: skip
    (work / "setup.json").write_text(json.dumps(setup, indent=1))
    torch.save(dict(init=_state(model), batches=batches), work / "shared.pt")
    return work, setup


def our_side(work: Path, setup: dict, args: argparse.Namespace, nudge: float = 0.0) -> dict:
    """Our train.py's pieces on the shared weights and batches; ``nudge``: each initial weight times (1 +- nudge)."""
    import torch

    from ddp_utils import engine
    from ddp_utils.engine.optim_setup import optimizer_from_hyp
    from ddp_utils.yolo import ComputeLoss, Model, scale_loss_gains

    shared = torch.load(work / "shared.pt", weights_only=True)
    model = Model(args.cfg, nc=setup["nc"])
    init = shared["init"]
    if nudge:  # the float noise floor: as far as rounding alone takes two runs apart
        signs = torch.Generator().manual_seed(0)
        init = {
            k: v * (1 + nudge * (torch.randint(0, 2, v.shape, generator=signs) * 2 - 1)) if v.is_floating_point() else v
            for k, v in init.items()
        }
    model.load_state_dict(init)
    batches, epochs = shared["batches"], setup["epochs"]
    nb = len(batches) // epochs
    optim = optimizer_from_hyp(
        model, setup["hyp"], name="SGD", batch_size=setup["batch_size"], epochs=epochs, batches_per_epoch=nb
    )
    ema = engine.ModelEMA(model)
    gains = scale_loss_gains(setup["hyp"], model.model[-1].nl, setup["nc"], setup["imgsz"], 0.0)
    compute_loss = ComputeLoss(model, gains, across_ranks=True)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    step = engine.TrainStep(model, optim.optimizer, scaler, ema, compute_loss, optim.accumulate, optim.warmup)
    record = _Recorder(model, ema)
    optim.optimizer.register_step_pre_hook(record.grads_at_first_step)
    optim.scheduler.last_epoch = -1
    for epoch in range(epochs):
        model.train()
        optim.optimizer.zero_grad()
        for i in range(nb):
            imgs, targets = batches[epoch * nb + i]
            steps = step.optimizer_steps
            record.losses.append(step(step.prepare(imgs, torch.device("cpu")), targets, i + nb * epoch, epoch).clone())
            if step.optimizer_steps > steps:
                record.after_step()
        optim.scheduler.step()
    return record.result()


def ours_fresh(args: argparse.Namespace, nc: int) -> dict:
    import torch

    import ddp_utils as du
    from ddp_utils.yolo import Model

    du.init_seeds(args.seed)
    model = Model(args.cfg, nc=nc)
    bn = [(m.eps, m.momentum) for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    return dict(fresh=_state(model), bn=torch.tensor(bn, dtype=torch.float64))


def head_biases(state: dict, nc: int, na: int = 3) -> list[tuple[float, float, float, float]]:
    """Per level: (mean, std) of the objectness biases and of the class biases of a head's state dict."""
    rows = []
    for level in range(3):
        bias = state[f"model.24.m.{level}.bias"].view(na, -1)
        obj, cls = bias[:, 4], bias[:, 5 : 5 + nc]
        rows.append((float(obj.mean()), float(obj.std()), float(cls.mean()), float(cls.std())))
    return rows


def compare(setup: dict, ours: dict, theirs: dict, nudged: dict, fresh: dict) -> str:
    import torch

    lines = ["| compared (ours against YOLOv5's) | relative norm of the difference | worst tensor |", "|---|---|---|"]

    def row(name: str, a: dict, b: dict) -> None:
        rel, worst, where = relative_difference(a, b)
        lines.append(f"| {name} | {rel:.2e} | {worst:.2e} ({where}) |")

    first_a, first_b = ours["losses"][0], theirs["losses"][0]
    rel_loss = float((first_a - first_b).norm() / first_b.norm())
    lines.append(
        f"| first batch's loss items (box, obj, cls) | {rel_loss:.2e} | ours {_fmt(first_a)}, YOLOv5 {_fmt(first_b)} |"
    )
    row("gradients at the first optimizer step (after clipping)", ours["grads"], theirs["grads"])
    row("weights after the first optimizer step", ours["first"]["model"], theirs["first"]["model"])
    row("EMA after the first optimizer step", ours["first"]["ema"], theirs["first"]["ema"])
    for name, other in (("YOLOv5's", theirs), ("ours nudged", nudged)):
        per_batch = ((ours["losses"] - other["losses"]).norm(dim=1) / other["losses"].norm(dim=1)).tolist()
        first_off = next((i for i, v in enumerate(per_batch) if v > 1e-3), None)
        lines.append(
            f"| loss items of each of the {len(per_batch)} batches: {name} | largest {max(per_batch):.2e} | "
            + (f"first above 1e-3 at batch {first_off}" if first_off is not None else "none above 1e-3")
            + "; every 4th: "
            + " ".join(f"{v:.0e}" for v in per_batch[::4])
            + " |"
        )
    row(f"weights after all {theirs['steps']} optimizer steps (ours: {ours['steps']})", ours["final"]["model"],
        theirs["final"]["model"])  # fmt: skip
    row("EMA after all steps", ours["final"]["ema"], theirs["final"]["ema"])
    row(f"noise floor: ours against ours with every initial weight times (1 +- {NUDGE:.0e}), weights after all steps",
        ours["final"]["model"], nudged["final"]["model"])  # fmt: skip

    nc = setup["nc"]
    lines += ["", "what each builds before training (seed " + str(setup["seed"]) + ")", ""]
    lines += ["| head level | objectness bias mean (std): ours / YOLOv5 | class bias mean (std): ours / YOLOv5 |"]
    lines.append("|---|---|---|")
    for level, (a, b) in enumerate(zip(head_biases(fresh["ours_init"], nc), head_biases(theirs["fresh"], nc))):
        lines.append(
            f"| P{level + 3} | {a[0]:.3f} ({a[1]:.3f}) / {b[0]:.3f} ({b[1]:.3f}) | "
            f"{a[2]:.3f} ({a[3]:.3f}) / {b[2]:.3f} ({b[3]:.3f}) |"
        )
    same_bn = torch.equal(fresh["bn"], theirs["bn"])
    conv_ratio = [
        float(fresh["ours_fresh"][k].std() / theirs["fresh"][k].std())
        for k in theirs["fresh"]
        if k.endswith("conv.weight") and k in fresh["ours_fresh"]
    ]
    lines += [
        "",
        f"BatchNorm eps and momentum: {'the same in every layer' if same_bn else 'DIFFERENT'} "
        f"({fresh['bn'][0].tolist()}); convolution weight std ours / YOLOv5 over {len(conv_ratio)} layers: "
        f"{min(conv_ratio):.3f} to {max(conv_ratio):.3f}; key sets: missing {theirs['missing']}, "
        f"only ours {theirs['unexpected']}",
    ]
    fp16 = {k: v.half().float() for k, v in fresh["ours_init"].items() if v.is_floating_point()}
    rel, worst, where = relative_difference(fp16, fresh["ours_init"])
    lines.append(
        f"YOLOv5's train.py rounds the initial weights to fp16 (model.half().float()): {rel:.1e} ({worst:.1e})"
    )
    return "\n".join(lines)


def _fmt(items: Any) -> str:
    return "/".join(f"{v:.5f}" for v in items.tolist())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.yolov5_side is not None:
        yolov5_side(args.yolov5_side)
        return 0
    sys.path.insert(0, str(REPO))
    import torch

    torch.set_num_threads(1)
    work, setup = prepare(args)
    env = without_checkout()
    env["OMP_NUM_THREADS"] = "1"
    command = [args.yolov5_python or sys.executable, str(Path(__file__).resolve()), "--yolov5-side", str(work)]
    done = subprocess.run(command, cwd=args.yolov5.resolve(), env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"parity_step: YOLOv5's side failed:\n{done.stderr[-3000:]}")
    theirs = torch.load(work / "yolov5.pt", weights_only=True)
    ours = our_side(work, setup, args)
    nudged = our_side(work, setup, args, nudge=NUDGE)
    fresh = ours_fresh(args, setup["nc"])
    fresh["ours_init"] = torch.load(work / "shared.pt", weights_only=True)["init"]
    fresh["ours_fresh"] = fresh.pop("fresh")
    print(compare(setup, ours, theirs, nudged, fresh))
    return 0


if __name__ == "__main__":
    sys.exit(main())
