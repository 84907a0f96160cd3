"""Worker functions for tests/distributed/test_sync_batchnorm.py, run in real gloo process groups."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_utils as du
from ddp_utils.distributed import GroupBatchNorm, convert_sync_batchnorm

GLOBAL_BATCH = 8


def small_net(momentum: float | None = 0.1) -> nn.Module:
    """Conv-BN-SiLU twice, the same weights in every process (seeded)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1, bias=False),
        nn.BatchNorm2d(6, momentum=momentum),
        nn.SiLU(),
        nn.Conv2d(6, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4, momentum=momentum),
        nn.SiLU(),
    )


def batches(steps: int) -> list[torch.Tensor]:
    """The global batches: 8 images each, not centred (mean 0.5, so E[x^2] - E[x]^2 is tested too)."""
    gen = torch.Generator().manual_seed(1)
    return [torch.rand(GLOBAL_BATCH, 3, 9, 9, generator=gen) * 2 + 0.5 * step for step in range(steps)]


def loss_weights(shape: torch.Size) -> torch.Tensor:
    """A fixed, uneven weighting of the outputs, so every output's gradient differs."""
    return torch.linspace(-1, 2, int(torch.tensor(shape).prod())).view(shape)


def run_steps(model: nn.Module, imgs: list[torch.Tensor], world_size: int) -> dict[str, list]:
    """Forward, backward and an SGD step per batch; what each step saw, for comparison."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    record: dict[str, list] = {"out": [], "input_grad": [], "param_grad": []}
    for x in imgs:
        x = x.clone().requires_grad_(True)
        out = model(x)
        weights = loss_weights(out.shape[1:])
        loss = (out * weights).sum() * world_size  # DDP averages gradients over ranks: the sum over images
        optimizer.zero_grad()
        loss.backward()
        record["out"].append(out.detach())
        record["input_grad"].append(x.grad.detach() / world_size)  # d(the sum over images) / dx
        record["param_grad"].append([p.grad.detach().clone() for p in model.parameters()])
        optimizer.step()
    return record


def trained_state(model: nn.Module) -> dict[str, torch.Tensor]:
    module = model.module if hasattr(model, "module") else model
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def synced_steps(out_dir: str, steps: str = "2", momentum: str = "0.1") -> None:
    """Each of the ranks trains its share of every global batch with DDP and GroupBatchNorm."""
    info = du.init_distributed(backend="gloo")
    model = convert_sync_batchnorm(small_net(None if momentum == "none" else float(momentum)))
    kinds = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)})
    assert kinds == ["GroupBatchNorm"], kinds
    share = GLOBAL_BATCH // info.world_size
    mine = [b[info.rank * share : (info.rank + 1) * share] for b in batches(int(steps))]
    ddp = DDP(model)
    record = run_steps(ddp, mine, info.world_size)
    ddp.eval()
    record["eval_out"] = [model(mine[0]).detach()]
    record["state"] = trained_state(ddp)
    torch.save(record, Path(out_dir) / f"rank{info.rank}.pt")
    du.cleanup()
    sys.stdout.write("done\n")


def reference(steps: int, momentum: float | None) -> dict:
    """One process, plain BatchNorm2d, the whole global batch."""
    model = small_net(momentum)
    imgs = batches(steps)
    record = run_steps(model, imgs, 1)
    model.eval()
    record["eval_out"] = [model(imgs[0]).detach()]
    record["state"] = trained_state(model)
    return record


__all__ = ["GroupBatchNorm", "reference", "synced_steps"]
