"""What a run's epochs work with (:class:`Training`), and :func:`build_training`, which puts it together in the
one order that works.

The order is the point of this module; each rule is a named step, each docstring says what breaks otherwise:

1. :func:`prepare_model`: channels_last and the head's class biases, on the bare model, before anything copies
   it or lays itself out after it (the EMA's copy, DDP's gradient buckets).
2. the optimizer, the EMA and the loss scaler, then :func:`~ddp_utils.run.resume.start_state`: a resumed run's
   weights, optimizer, EMA and scaler are put back here, on the bare model, before the wrappers.
3. :func:`wrap_for_ranks`: SyncBatchNorm, DDP (its construction broadcasts rank 0's weights: the restored ones),
   then ``torch.compile`` (Dynamo sees DDP's hooks).
4. :func:`make_step`: the :class:`~ddp_utils.engine.TrainStep` last, after every wrapper: its non-finite guard
   rebinds BatchNorm's buffers into one tensor, and a conversion after it would leave the guard watching
   tensors the model no longer uses.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from ..data.class_weights import class_frequency
from ..data.loader import EpochLoader
from ..distributed import DistInfo
from ..distributed.debug import ddp_process_group
from ..engine.ema import ModelEMA
from ..engine.loop import TrainStep
from ..engine.memory_format import to_channels_last
from ..engine.optim_setup import OptimizerSetup, optimizer_from_hyp
from ..engine.wrap import wrap_model
from ..yolo.loss import ComputeLoss, scale_loss_gains
from .resume import gather_losses, start_state
from .start import Run
from .train_state import TrainState


@dataclasses.dataclass
class Training:
    """What a run's epochs work with: the step (model, optimizer, EMA, loss), the schedule, the data, the state.

    Attributes:
        step: the :class:`~ddp_utils.engine.TrainStep`.
        scheduler: the per-epoch LR schedule.
        train_loader, val_loader: the loaders.
        labels: the training labels (the label plot, ``--image-weights``).
        state: where training stands (:class:`~ddp_utils.run.train_state.TrainState`): the epoch and batch
            to continue at, the best fitness, the last validation.
    """

    step: TrainStep
    scheduler: torch.optim.lr_scheduler.LambdaLR
    train_loader: EpochLoader
    val_loader: EpochLoader
    labels: list
    state: TrainState = dataclasses.field(default_factory=TrainState)

    def state_at(self, stats: Any, world_size: int, skipped: int) -> TrainState:
        """Where training stands now: :attr:`state`, at ``stats``' batch of its epoch when given (a mid-epoch save,
        or an epoch trained but not validated). With ``stats``, a collective: every rank's running loss is gathered.

        Args:
            stats: the epoch's :class:`~ddp_utils.engine.EpochStats` so far, or None (the state at an epoch's end).
            world_size: the processes training now (a resume reports a change of scale).
            skipped: the optimizer steps skipped so far in the run (non-finite gradients).
        """
        now = dict(world_size=world_size, skipped=skipped)
        if stats is not None:
            now.update(batch=stats.batch, last_opt_step=self.step.last_opt_step, loss=gather_losses(stats.loss))
        return dataclasses.replace(self.state, **now)


def build_training(run: Run, model: nn.Module, device: torch.device, info: DistInfo, gs: int, data: tuple) -> Training:
    """Optimizer, schedule, EMA, loss and the DDP wrapper, in the order the module's docstring gives; a resumed
    run's state put back, to the batch.

    Args:
        run: the settled run (options, hyperparameters, what it resumes, how it computes).
        model: the bare model, on its device.
        device: where it trains.
        info: this process's place in the group.
        gs: the model's grid size (``--multi-scale`` draws multiples of it).
        data: ``(train_loader, val_loader, labels)``.
    """
    train_loader, val_loader, labels = data
    prepare_model(run, model, labels)
    sizes = dict(batch_size=run.batch_size, epochs=run.epochs, batches_per_epoch=len(train_loader))
    optim = optimizer_from_hyp(model, run.hyp, name=run.opt.optimizer, cos_lr=run.opt.cos_lr, **sizes)
    ema = ModelEMA(model)
    scaler = torch.amp.GradScaler("cuda", enabled=run.amp == "fp16")  # bf16 needs no loss scaling
    state = start_state(run.resume, model, optim.optimizer, ema, scaler, len(train_loader), run.batch_size)
    optim.scheduler.last_epoch = state.epoch - 1  # the schedule follows the epoch (lr from the optimizer's state)
    gains = scale_loss_gains(run.hyp, model.model[-1].nl, run.nc, run.imgsz, run.opt.label_smoothing)
    compute_loss = ComputeLoss(model, gains, across_ranks=True)  # normalised over the global batch
    if run.channels_last:  # the EMA's copy computes as the model does (validation, the saved weights)
        to_channels_last(ema.ema)
    model = wrap_for_ranks(run, model, device, info)
    step = make_step(run, model, optim, (scaler, ema, compute_loss), info, gs, state.last_opt_step)
    return Training(step, optim.scheduler, train_loader, val_loader, labels, state)


def prepare_model(run: Run, model: nn.Module, labels: list) -> None:
    """The bare model made ready to train: channels_last where the run computes so (:attr:`Run.channels_last`),
    and a new run's class biases from the label counts (YOLOv5's ``initialize_biases``).

    First of all: the EMA copies the model as it stands and DDP lays its gradient buckets out like the parameters
    when it is built, so a conversion after them would leave the copy, or the buckets, in the other layout (the
    copy with the other biases); the optimizer keeps the same parameter objects (converted in place) either way.
    """
    if run.channels_last:
        to_channels_last(model)
    if run.resume is None and not run.opt.weights:  # a resume or fine-tune keeps the biases it loads
        model.initialize_biases(class_frequency(labels, run.nc))


def wrap_for_ranks(run: Run, model: nn.Module, device: torch.device, info: DistInfo) -> nn.Module:
    """SyncBatchNorm (``--sync-bn``), DDP, then ``torch.compile`` (``--compile``), around the restored model.

    After the state is restored: DDP broadcasts rank 0's parameters and buffers when it is built, so every rank
    starts from the weights a resume put back. SyncBatchNorm before DDP (DDP registers the modules it finds);
    compile after it, so Dynamo traces DDP's gradient hooks. Under ``--dist-debug`` on gloo DDP needs a process
    group of its own (:mod:`ddp_utils.distributed.debug`).
    """
    group = ddp_process_group() if info.distributed else None
    wrap = dict(distributed=info.distributed, sync_bn=run.opt.sync_bn, compile=run.opt.compile, process_group=group)
    return wrap_model(model, device, **wrap)


def make_step(
    run: Run, model: nn.Module, optim: OptimizerSetup, parts: tuple, info: DistInfo, gs: int, last_opt_step: int
) -> TrainStep:
    """The :class:`~ddp_utils.engine.TrainStep` around the wrapped model, last of all.

    Its non-finite guard rebinds BatchNorm's running statistics into one flat tensor (one copy per step to undo a
    bad one); a wrapper or conversion made after it would put the model on tensors the guard no longer watches.

    Args:
        parts: ``(scaler, ema, compute_loss)``.
        last_opt_step: the batch of the last optimizer step (a resume continues its accumulation window).
    """
    scaler, ema, compute_loss = parts
    multi_scale = (run.imgsz, gs, run.opt.seed) if run.opt.multi_scale else None
    settings = dict(amp=run.amp, world_size=info.world_size, multi_scale=multi_scale, channels_last=run.channels_last)
    step_parts = (model, optim.optimizer, scaler, ema, compute_loss, optim.accumulate, optim.warmup)
    return TrainStep(*step_parts, **settings, last_opt_step=last_opt_step)


__all__ = ["Training", "build_training", "make_step", "prepare_model", "wrap_for_ranks"]
