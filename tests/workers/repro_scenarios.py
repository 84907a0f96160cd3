"""Worker functions for tests/test_reproducibility.py: one yolov5n training step, 1 or N processes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_utils as du
from ddp_utils.data import check_dataset, create_dataloader, load_hyp
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
