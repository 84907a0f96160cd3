"""Worker functions for tests/distributed/test_sync_batchnorm.py, run in real gloo process groups."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules._functions import SyncBatchNorm as TorchSyncBatchNormFunction
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode

import ddp_utils as du
from ddp_utils.distributed import GroupBatchNorm, convert_sync_batchnorm

from ..hostwait import HostWaitCounter

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


class CpuSyncBatchNormKernels(TorchDispatchMode):
    """CPU versions of the three CUDA-only kernels of torch's SyncBatchNorm forward, so that its autograd
    function (``torch.nn.modules._functions.SyncBatchNorm``) runs on the CPU under gloo, Python and all,
    and the host-wait counter sees what it does between them."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if name == "batch_norm_stats":
            x, eps = args
            dims = [0, *range(2, x.dim())]
            return x.mean(dims), torch.rsqrt(x.var(dims, unbiased=False) + eps)
        if name == "batch_norm_gather_stats_with_counts":
            _x, means, invstds, running_mean, running_var, momentum, eps, counts = args
            counts = counts.view(-1, 1).to(means.dtype)
            n = counts.sum()
            mean = (counts * means).sum(0) / n
            var = (counts * (invstds.pow(-2) - eps + (means - mean) ** 2)).sum(0) / n  # biased
            running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
            running_var.mul_(1 - momentum).add_(var * n / (n - 1), alpha=momentum)
            return mean, torch.rsqrt(var + eps)
        if name == "batch_norm_elemt":
            x, weight, bias, mean, invstd, _eps = args
            shape = [1, -1] + [1] * (x.dim() - 2)
            return (x - mean.view(shape)) * invstd.view(shape) * weight.view(shape) + bias.view(shape)
        return func(*args, **(kwargs or {}))


def host_waits() -> None:
    """Count host waits in a training forward and backward of GroupBatchNorm layers (2 ranks, gloo), and in
    the forward of torch's SyncBatchNorm function over the same input, run on the CPU with the kernels above.

    torch's function is called as ``nn.SyncBatchNorm.forward`` calls it on CUDA (the module itself refuses CPU
    tensors); both layers' outputs are compared, so the CPU kernels are seen to compute torch's numbers.
    """
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo", timeout=60)
    share = GLOBAL_BATCH // info.world_size
    x = batches(1)[0][info.rank * share : (info.rank + 1) * share]
    record: dict = {"rank": info.rank}
    for momentum in (0.1, None):
        model = convert_sync_batchnorm(small_net(momentum))
        with HostWaitCounter() as counter:
            for _ in range(2):
                model(x.clone().requires_grad_(True)).sum().backward()
        record[f"group_waits_momentum_{momentum}"] = [str(w) for w in counter.waits]
        record[f"group_tracked_{momentum}"] = int(model[1].num_batches_tracked)
    bn = GroupBatchNorm(3)
    ours = bn(x)
    plain = nn.BatchNorm2d(3)
    with CpuSyncBatchNormKernels(), HostWaitCounter() as counter:
        theirs = TorchSyncBatchNormFunction.apply(
            x, plain.weight, plain.bias, plain.running_mean, plain.running_var, 1e-5, 0.1, dist.group.WORLD, 2
        )
    record["torch_waits"] = [w.op for w in counter.waits]
    record["torch_equals_ours"] = torch.allclose(theirs, ours, atol=1e-5) and torch.allclose(
        plain.running_var, bn.running_var, atol=1e-6
    )
    print(json.dumps(record))
    du.cleanup()


__all__ = ["CpuSyncBatchNormKernels", "GroupBatchNorm", "host_waits", "reference", "synced_steps"]
