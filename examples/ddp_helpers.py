"""The README's helper example, runnable: a few steps of YOLOv5n on the synthetic shapes data.

    python examples/ddp_helpers.py                                    # one process: a GPU if any, else the CPU
    torchrun --nproc_per_node 2 examples/ddp_helpers.py --device cpu  # two processes (gloo)

Offline: shapes.yaml's images are generated on first use (in ./datasets, or $DDP_UTILS_DATASETS_DIR).
The same code runs under python and torchrun: without a process group every helper is a no-op
or gives the single-process answer.
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_utils as du
from ddp_utils.yolo import ComputeLoss, Model, scale_loss_gains

parser = argparse.ArgumentParser(description="ddp_utils' helpers in a short training loop")
parser.add_argument("--device", default="", help="'' (a GPU if any, else the CPU), cpu, 0, 0,1, ...")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batches", type=int, default=4, help="at most this many batches per epoch and process (8 images)")
opt = parser.parse_args()

info = du.dist_info()  # torchrun / srun / a single process (rank -1)
device = du.select_device(opt.device, batch_size=8 * info.world_size)  # this process's device
du.init_distributed(device=device)  # binds the device, joins the group (gloo for CPU, NCCL for GPUs)
du.init_seeds(du.rank_seed(0, info.rank))  # a different seed on each rank
hyp = du.load_hyp("hyp.shapes.yaml")
data = du.check_dataset("shapes.yaml")  # generated once per node if missing; the others wait
imgsz = 128  # pixels, small for a CPU
loader, dataset = du.create_dataloader(
    data["train"], imgsz, 8, 32, augment=True, hyp=hyp, rank=info.local_rank, workers=2, shuffle=True
)

model = Model("yolov5n.yaml", nc=data["nc"]).to(device)
# the hyp's loss gains are for 3 levels, 80 classes and 640 px: scaled to this model and size, as train.py does
compute_loss = ComputeLoss(model, scale_loss_gains(hyp, model.model[-1].nl, data["nc"], imgsz))
if info.distributed:
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # copies rank 0's weights
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

for epoch in range(opt.epochs):
    loader.set_epoch(epoch)  # that epoch's shuffle and augmentation
    model.train()
    epoch_loss = torch.zeros(3, device=device)
    for i, (imgs, targets, _paths, _shapes) in enumerate(loader):
        if i == opt.batches:
            break
        imgs = imgs.to(device, non_blocking=True).float() / 255  # uint8 -> 0-1
        loss, loss_items = compute_loss(model(imgs), targets.to(device))
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks here
        optimizer.step()
        epoch_loss = (epoch_loss * i + loss_items) / (i + 1)  # the mean over the batches run so far
    epoch_loss = du.reduce_tensor(epoch_loss, op="mean")  # the mean over all ranks, on every rank
    if du.is_main_process():
        box, obj, cls = epoch_loss.tolist()
        print(f"epoch {epoch + 1}/{opt.epochs}: box {box:.4f} obj {obj:.4f} cls {cls:.4f} "
              f"({info.world_size} process(es) on {device}, {len(dataset)} images)")  # fmt: skip
du.cleanup()
