"""The training model's wrappers, in the order that keeps the step fast: SyncBatchNorm, DDP, then compile.

``torch.compile`` of the DDP-wrapped module lets Dynamo see DDP: it splits the graph at the
gradient buckets' boundaries (its DDP optimizer), so each bucket's all-reduce starts while the
backward of the layers before it still runs. Compiling the bare model first and wrapping it
afterwards hides DDP from Dynamo: one graph, and the all-reduce waits for the whole backward.

DDP's options:

- ``gradient_as_bucket_view=True``: the gradients are views into the all-reduce buckets, so the
  reduced values need no copy back (one full gradient copy and its memory less per step).
- ``broadcast_buffers=False``: without it, DDP broadcasts rank 0's buffers (BatchNorm running
  statistics) before every forward. Training-mode BatchNorm normalises by the batch's own
  statistics, so the broadcast changes no gradient, and rank 0, whose model and EMA are the
  ones saved, receives its own buffers; the EMAs are made equal (rank 0's) by
  :meth:`~ddp_utils.engine.ModelEMA.sync` before every validation. Rank 0's numbers are the same
  either way (a two-process test checks this bit for bit), with one broadcast per step less.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ..distributed import is_main_process
from ..distributed.sync_batchnorm import GroupBatchNorm, convert_sync_batchnorm
from ..log import LOGGER


def wrap_model(
    model: nn.Module,
    device: torch.device,
    *,
    distributed: bool,
    sync_bn: bool = False,
    compile: bool = False,
    compile_backend: str = "inductor",
    process_group: Any = None,
    broadcast_buffers: bool = False,
) -> nn.Module:
    """``model`` made ready for the training step: SyncBatchNorm and DDP when distributed, then compiled.

    Args:
        model: the bare model, already on ``device`` (and in channels_last if wanted).
        device: its device; a CUDA device's index becomes DDP's ``device_ids``.
        distributed: wrap in DDP (a process group must be initialised).
        sync_bn: convert BatchNorm layers to SyncBatchNorm first (DDP only).
        compile: ``torch.compile`` the result (the DDP module when distributed).
        compile_backend: the backend for ``torch.compile``.
        process_group: DDP's group (None: the default one).
        broadcast_buffers: DDP's option (see the module's notes for why it is off).

    Returns:
        The module to train; :func:`~ddp_utils.distributed.parallel.de_parallel` gives the bare model
        back (checkpoints and the EMA use that one).

    Examples:
        >>> net = nn.Linear(2, 2)
        >>> wrap_model(net, torch.device("cpu"), distributed=False) is net
        True
    """
    if distributed:
        if sync_bn:
            model = convert_sync_batchnorm(model, process_group).to(device)  # torch's on CUDA, ours on gloo
            if is_main_process():
                LOGGER.info(f"--sync-bn: {_synchronised(model)}")
        with warnings.catch_warnings():
            # torch 2.10+ deprecates the option in favour of forward_sync_buffers, whose False still syncs the
            # buffers at init; broadcast_buffers=False is what keeps each rank's own (see the module's notes)
            warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
            model = DDP(
                model,
                device_ids=[device.index] if device.type == "cuda" else None,
                process_group=process_group,
                gradient_as_bucket_view=True,
                broadcast_buffers=broadcast_buffers,
            )
    if compile:
        model = torch.compile(model, backend=compile_backend)
    return model


def _synchronised(model: nn.Module) -> str:
    """What ``--sync-bn`` converted, for the log: ``"62 BatchNorm layers -> GroupBatchNorm (ddp_utils, gloo)"``."""
    kinds = Counter(type(m) for m in model.modules() if isinstance(m, (nn.SyncBatchNorm, GroupBatchNorm)))
    if not kinds:
        return "the model has no BatchNorm layer: nothing to synchronise"
    names = {nn.SyncBatchNorm: "torch's SyncBatchNorm (NCCL)", GroupBatchNorm: "GroupBatchNorm (ddp_utils, gloo)"}
    return ", ".join(f"{n} BatchNorm layers -> {names[kind]}" for kind, n in kinds.items())
