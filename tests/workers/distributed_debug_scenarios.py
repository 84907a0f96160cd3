"""Ranks that call mismatched collectives under ``enable_debug`` (run by tests/test_dist_debug.py)."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import ddp_utils as du
from ddp_utils.distributed import ddp_process_group, enable_debug


def mismatched_collective(dump_dir: str, kind: str) -> None:
    """Rank 0 all-reduces; rank 1 broadcasts ("op") or all-reduces a longer tensor ("shape")."""
    settings = enable_debug(dump_dir)
    du.init_distributed(device="cpu", timeout=60)
    rank = dist.get_rank()
    tensor = torch.ones(3 + (rank if kind == "shape" else 0))
    try:
        if kind == "op" and rank == 1:
            dist.broadcast(tensor, src=0)
        else:
            dist.all_reduce(tensor)
        error = None
    except RuntimeError as exc:
        error = str(exc)
    sys.stdout.write(json.dumps({"rank": rank, "error": error, "env": settings.env}) + "\n")
    sys.stdout.flush()
    du.cleanup(wait=False)


def ddp_then_mismatch(dump_dir: str) -> None:
    """DDP trains a step on ddp_process_group(); a mismatched all-reduce on the default group is still caught."""
    enable_debug(dump_dir)
    du.init_distributed(device="cpu", timeout=60)
    rank = dist.get_rank()
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=ddp_process_group())
    ddp(torch.randn(2, 3, 8, 8)).sum().backward()
    grads_equal = du.all_gather_object(model[0].weight.grad.sum().item())
    try:
        dist.all_reduce(torch.ones(3 + rank))
        error = None
    except RuntimeError as exc:
        error = str(exc)
    sys.stdout.write(json.dumps({"rank": rank, "error": error, "grads": grads_equal}) + "\n")
    sys.stdout.flush()
    du.cleanup(wait=False)
