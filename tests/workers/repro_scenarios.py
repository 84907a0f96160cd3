"""Worker functions for tests/test_reproducibility.py: yolov5n training steps, 1 or N processes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_utils as du
from ddp_utils import engine
from ddp_utils.data import check_dataset, class_frequency, create_dataloader, load_hyp
from ddp_utils.engine.optim_setup import optimizer_from_hyp
from ddp_utils.yolo import ComputeLoss, Model, scale_loss_gains
from ddp_utils.yolo.finetune import grid_size


def train_loader(data: dict, hyp: dict, imgsz: int, batch: int, stride: int, local_rank: int):
    """train.py's training loader: augmented, shuffled with seed 3, no worker processes."""
    loader, _ = create_dataloader(
        data["train"], imgsz, batch, stride, hyp=hyp, augment=True, rank=local_rank, workers=0, shuffle=True, seed=3
    )
    return loader


def one_step(data_yaml: str, out_dir: str, global_batch: str = "16", imgsz: str = "128") -> None:
    """The first step's loss and gradients of yolov5n on the first global batch (rank 0 writes them)."""
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    info = du.init_distributed(backend="gloo") if world > 1 else du.dist_info()
    data, hyp = check_dataset(data_yaml), load_hyp("hyp.shapes.yaml")
    du.init_seeds(3)
    model = Model("yolov5n.yaml", ch=3, nc=int(data["nc"]))
    gs = grid_size(model)
    loader = train_loader(data, hyp, int(imgsz), int(global_batch) // world, gs, info.local_rank if world > 1 else -1)
    loader.set_epoch(0)
    imgs, targets, _, _ = next(iter(loader))
    loss_fn = ComputeLoss(model, scale_loss_gains(hyp, 3, int(data["nc"]), int(imgsz)), across_ranks=True)
    net = DDP(du.distributed.convert_sync_batchnorm(model)) if world > 1 else model
    loss, items = loss_fn(net(imgs.float() / 255), targets)
    (loss * world).backward()
    items = du.reduce_tensor(items, op="mean")  # on every rank: a collective
    if info.rank <= 0:
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        torch.save({"grads": grads, "items": items}, Path(out_dir) / f"step{world}.pt")
    if world > 1:
        du.cleanup()
    sys.stdout.write("done\n")


def float64_epoch(
    data_yaml: str, out_dir: str, global_batch: str = "16", imgsz: str = "96", sync_bn: str = "1"
) -> None:
    """train.py's first epoch in float64: its loader, optimizer and warm-up, EMA, group-normalised loss,
    GroupBatchNorm and DDP, the model and images in float64 (rank 0 writes the weights, buffers and EMA).

    In float64 the rounding that float32 training amplifies step after step is some 1e-16, so two scales
    that train on the same images with the same math agree to far below float32's precision, and any
    difference in the data or the math between scales stands out (float32: about 1e-6 of an update per step).
    """
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    info = du.init_distributed(backend="gloo") if world > 1 else du.dist_info()
    data, hyp, size = check_dataset(data_yaml), load_hyp("hyp.shapes.yaml"), int(imgsz)
    nc = int(data["nc"])
    du.init_seeds(du.rank_seed(3, info.rank))  # as train.py: DDP broadcasts rank 0's weights
    model = Model("yolov5n.yaml", ch=3, nc=nc)
    gs = grid_size(model)
    loader, dataset = create_dataloader(
        data["train"], size, int(global_batch) // world, gs, hyp=hyp, augment=True,
        rank=info.local_rank if world > 1 else -1, workers=0, shuffle=True, seed=3,
    )  # fmt: skip
    model.initialize_biases(class_frequency(dataset.labels, nc))
    model.double()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    sizes = dict(batch_size=int(global_batch), epochs=1, batches_per_epoch=len(loader))
    optim = optimizer_from_hyp(model, hyp, **sizes)
    ema = engine.ModelEMA(model)  # float32 by design: its copy carries float32 rounding
    loss_fn = ComputeLoss(model, scale_loss_gains(hyp, model.model[-1].nl, nc, size), across_ranks=True)
    net = engine.wrap_model(model, torch.device("cpu"), distributed=world > 1, sync_bn=sync_bn == "1")
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    parts = (net, optim.optimizer, scaler, ema, loss_fn, optim.accumulate, optim.warmup)
    step = engine.TrainStep(*parts, world_size=world)
    loader.set_epoch(0)
    engine.train_one_epoch(step, ((imgs.double() / 255, t, p, s) for imgs, t, p, s in loader), 0, torch.device("cpu"),
                           nb=len(loader))  # fmt: skip
    if info.rank <= 0:
        state = {"start": start, "model": model.state_dict(), "ema": ema.ema.state_dict(), "ema_updates": ema.updates,
                 "lr": [g["lr"] for g in optim.optimizer.param_groups], "steps": step.optimizer_steps}  # fmt: skip
        torch.save(state, Path(out_dir) / f"float64_{world}_{sync_bn}.pt")
    if world > 1:
        du.cleanup()
    sys.stdout.write("done\n")


def epoch_batches(
    data_yaml: str, out_dir: str, global_batch: str = "16", imgsz: str = "128", epochs: str = "2"
) -> None:
    """Every batch this rank loads in the first epochs (images and targets), saved for comparison."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    info = du.init_distributed(backend="gloo") if world > 1 else du.dist_info()
    data, hyp = check_dataset(data_yaml), load_hyp("hyp.shapes.yaml")
    loader = train_loader(data, hyp, int(imgsz), int(global_batch) // world, 32, info.local_rank if world > 1 else -1)
    seen = []
    for epoch in range(int(epochs)):
        loader.set_epoch(epoch)
        seen.append([(imgs.clone(), targets.clone()) for imgs, targets, _, _ in loader])
    torch.save(seen, Path(out_dir) / f"batches{world}_rank{max(info.rank, 0)}.pt")
    if world > 1:
        du.cleanup()
    sys.stdout.write("done\n")
