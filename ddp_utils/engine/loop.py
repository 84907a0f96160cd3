"""One epoch of training: the step, accumulation without needless all-reduces, AMP, and honest timing.

:func:`train_one_epoch` is the loop a training script calls once per epoch; the script keeps
the epoch loop itself (and validation, checkpoints, logging) in view. On a GPU the step
never waits for the host in steady state: the running loss stays on the device until the
progress bar refreshes (a few times a second), data-wait and compute time come from CUDA
events read once at the epoch's end, and the preemption flag travels in an all-reduce that
is read one step later. On the CPU the same code computes the same numbers as a plain loop.
"""

from __future__ import annotations

import contextlib
import enum
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..data.device.prefetch import images_to_float
from ..data.multiscale import multi_scale_resize
from ..progress import progress, progress_mode
from .amp import AMP_DTYPES
from .ema import ModelEMA
from .guard import NonFiniteGuard
from .optim import Warmup


class Action(enum.Enum):
    """What the epoch does after a step, as the run's control (:class:`~ddp_utils.run.control.StepControl`) says:
    go on, save and go on, or stop after this optimizer step."""

    GO = "go"
    SAVE = "save"
    STOP = "stop"


@dataclass
class TrainStep:
    """Everything one training step needs, and the step itself (:meth:`__call__`).

    Gradients accumulate until ``warmup.accumulate(ni, accumulate)`` batches have passed
    since the last optimizer step; on the batches in between, a DDP model skips its
    gradient all-reduce (``no_sync``): the sum is reduced once, at the step.

    Args:
        model: the model being trained (DDP-wrapped or not).
        optimizer: the optimizer.
        scaler: a GradScaler (disabled unless fp16).
        ema: the :class:`~ddp_utils.engine.ModelEMA`.
        compute_loss: ``(pred, targets) -> (loss, loss_items)``.
        accumulate: the target number of batches per optimizer step (nominal batch / batch).
        warmup: ramps lr, momentum and accumulation; None for none.
        amp: "fp16", "bf16" or "off" (:func:`resolve_amp`).
        world_size: the loss is scaled by it, since DDP averages gradients over ranks.
        multi_scale: ``(imgsz, grid, seed)`` to resize each batch to a size drawn from (seed, epoch, step)
            (``--multi-scale``: the same on every rank), or None.
        channels_last: put input batches in channels_last memory format (CUDA conv models).
        max_grad_norm: gradient clipping norm.
        guard_nonfinite: skip optimizer steps whose gradients are not finite and keep BatchNorm's statistics
            from them (:class:`~ddp_utils.engine.guard.NonFiniteGuard`, built here: make the step after the
            model's last conversion, since it rebinds BatchNorm's buffers into one tensor).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any
    ema: ModelEMA
    compute_loss: Callable[[Any, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    accumulate: int = 1
    warmup: Warmup | None = None
    amp: str = "off"
    world_size: int = 1
    multi_scale: tuple[int, ...] | None = None
    channels_last: bool = False
    max_grad_norm: float = 10.0
    last_opt_step: int = -1
    guard_nonfinite: bool = True
    optimizer_steps: int = field(default=0, init=False)
    guard: NonFiniteGuard | None = field(default=None, init=False)
    wait_for: Callable[[], None] | None = field(default=None, init=False)  # work the first step waits for

    def __post_init__(self) -> None:
        if self.guard_nonfinite:
            device = next(self.model.parameters()).device
            self.guard = NonFiniteGuard(self.model, device)

    def prepare(self, imgs: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A batch as floats in [0, 1] on ``device`` (channels_last when asked).

        A uint8 batch is moved and scaled; one a :class:`~ddp_utils.data.DevicePrefetcher` already
        moved and scaled on its side stream passes through.
        """
        return images_to_float(imgs.to(device, non_blocking=True), self.channels_last)

    def __call__(self, imgs: torch.Tensor, targets: torch.Tensor, ni: int, epoch: int) -> torch.Tensor:
        """Forward, backward and, when due, the optimizer step; returns the loss items (on the device)."""
        if self.wait_for is not None:  # a warm-up of the convolutions (engine.cudnn): it times kernels alone
            self.wait_for()
            self.wait_for = None
        if self.warmup is not None:
            self.warmup.step(ni, epoch)
        accumulate = self.warmup.accumulate(ni, self.accumulate) if self.warmup is not None else self.accumulate
        if self.multi_scale is not None:
            imgs = multi_scale_resize(imgs, *self.multi_scale, epoch=epoch, step=ni)
        optimizer_step = ni - self.last_opt_step >= accumulate
        no_sync = getattr(self.model, "no_sync", None)
        # a DDP all-reduce after a backward that no optimizer step follows would only be repeated later
        sync = contextlib.nullcontext() if optimizer_step or no_sync is None else no_sync()
        if self.guard is not None:
            self.guard.before_forward()
        with sync:
            with torch.autocast(imgs.device.type, dtype=AMP_DTYPES[self.amp], enabled=self.amp != "off"):
                pred = self.model(imgs)
                loss, loss_items = self.compute_loss(pred, targets.to(imgs.device, non_blocking=True))
                if self.world_size > 1:
                    loss *= self.world_size  # DDP averages gradients; the loss is a per-image sum
            if self.guard is not None:
                self.guard.check_loss(loss)
            self.scaler.scale(loss).backward()
        if optimizer_step:
            self.scaler.unscale_(self.optimizer)
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=self.max_grad_norm)
            if self.guard is not None:  # a step with non-finite gradients skipped on the device
                self.guard.optimizer_step(self.optimizer, self.scaler, norm)
            else:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            self.optimizer.zero_grad()
            self.ema.update(self.model)
            self.last_opt_step = ni
            self.optimizer_steps += 1
        return loss_items


@dataclass
class EpochStats:
    """What one call of :func:`train_one_epoch` measured.

    ``loss`` is the running mean (box, obj, cls) loss of this rank over the epoch's batches so far
    (those before ``start`` included, when the call continued a stopped epoch), still on the device;
    ``batch`` the epoch's batches trained when the call returned (the next one to train: the number
    of batches per epoch once it is complete); ``start`` the batch the call began at (0 unless it
    continued a stopped epoch); ``images`` this rank's image count in this call;
    ``seconds`` the call's wall time; ``data_seconds`` the time the step waited for data (on CUDA:
    the GPU's idle time between steps); ``stopped`` whether a stop request ended the call (at an
    optimizer step, or at the epoch's end before anything after it).
    """

    loss: torch.Tensor
    batch: int = 0
    start: int = 0
    images: int = 0
    seconds: float = 0.0
    data_seconds: float = 0.0
    stopped: bool = False

    def speed(self, world_size: int = 1) -> str:
        """The epoch's throughput, in the stable form ``"123.4 img/s, data wait 3.2%"`` that benchmarks parse."""
        rate = self.images * world_size / self.seconds if self.seconds > 0 else 0.0
        share = 100 * self.data_seconds / self.seconds if self.seconds > 0 else 0.0
        return f"{rate:.1f} img/s, data wait {share:.1f}%"


class _Timer:
    """Data-wait and compute time: CUDA events read at the epoch's end on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.events: list[tuple[Any, Any]] = []
        self.data_seconds = 0.0
        self.start = self.mark = time.perf_counter()

    def batch_ready(self) -> None:
        if self.cuda:
            self.events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            self.events[-1][0].record()
        else:
            self.data_seconds += time.perf_counter() - self.mark

    def step_done(self) -> None:
        if self.cuda:
            self.events[-1][1].record()
        else:
            self.mark = time.perf_counter()

    def finish(self) -> tuple[float, float]:
        """(wall seconds, data-wait seconds) of the epoch."""
        if self.cuda:
            torch.cuda.synchronize()  # CPU-GPU sync point: once per epoch, so the events can be read
            gaps = (done.elapsed_time(ready) for (_, done), (ready, _) in zip(self.events, self.events[1:]))
            self.data_seconds = sum(gaps) / 1000
        return time.perf_counter() - self.start, self.data_seconds


def train_one_epoch(
    step: TrainStep,
    loader: Iterable,
    epoch: int,
    device: torch.device,
    *,
    nb: int | None = None,
    start: int = 0,
    loss: torch.Tensor | None = None,
    epochs: int | None = None,
    control: Any = None,
    on_save: Callable[[EpochStats], None] | None = None,
    progress: bool = False,
    progress_seconds: float | None = None,
    on_batch: Callable[[int, torch.Tensor, torch.Tensor, Any], None] | None = None,
) -> EpochStats:
    """Train one epoch over ``loader`` (batches of ``(imgs, targets, paths, shapes)``), or what is left of it.

    The images are the loader's uint8 batch, or floats already on the device from a
    :class:`~ddp_utils.data.DevicePrefetcher` wrapped around it (on CUDA: the copy overlaps the step).

    After each batch ``control`` (a :class:`~ddp_utils.run.control.StepControl`) says, the same on every rank,
    whether to go on, save or stop. A stop (a signal on any rank, or non-finite steps that persist) ends the call
    after an optimizer step, so no gradient is left half-accumulated, or at the epoch's end, whichever comes first;
    the returned stats say where (``batch``), which is what a checkpoint records and a resumed call passes back as
    ``start`` and ``loss``. A periodic save (rank 0's clock) comes at an optimizer step too: ``on_save(stats)`` runs
    on every rank (it may use collectives), then ``control.saved()``, and training goes on.

    Args:
        step: the model, optimizer and step settings (``step.last_opt_step`` carries the
            accumulation phase across epochs and resumes).
        loader: the epoch's batches from ``start`` on (``loader.set_epoch(epoch, start)`` first).
        epoch: the epoch number (from 0); with ``nb`` it gives the global iteration ``ni``.
        device: where the batches go.
        nb: batches per epoch (default ``len(loader)``).
        start: the epoch's first batch still to train (a resumed epoch's); 0 for a whole epoch.
        loss: the running mean loss of the batches before ``start`` (from the checkpoint); zeros when None.
        epochs: the total, for the progress bar.
        control: the run's :class:`~ddp_utils.run.control.StepControl`, asked after every batch; None: never stop.
        on_save: called on every rank with the stats so far when a periodic save is agreed.
        progress: show the epoch's progress (the main process): a bar, plain lines or nothing, as
            :func:`ddp_utils.progress.progress_mode` says (``DDP_UTILS_PROGRESS``, else bar on a terminal).
        progress_seconds: how often the progress refreshes (and reads the loss back); None: the mode's default.
        on_batch: called with ``(i, imgs, targets, paths)`` for each batch (``i`` its index in the epoch;
            the images as the loader gave them), e.g. to plot the first ones.

    Returns:
        The epoch's :class:`EpochStats`; ``stopped`` when a stop request ended it.
    """
    nb = len(loader) if nb is None else nb  # type: ignore[arg-type]
    mloss, stats, bar, timer = _begin_epoch(step, device, loss, start, nb, progress, progress_seconds)
    for i, (batch_imgs, targets, paths, _shapes) in enumerate(loader, start):
        ni = i + nb * epoch
        imgs, mloss = _train_batch(step, stats, timer, batch_imgs, targets, mloss, i, ni, epoch, device)
        if on_batch is not None:
            on_batch(i, batch_imgs, targets, paths)
        _show(bar, i + 1 == nb, epoch, epochs, mloss, device, targets, imgs, step.world_size)
        if control is not None and _obey(control, step, stats, on_save, ni, last=i + 1 == nb):
            break
    return _end_epoch(bar, timer, stats, epoch, epochs, mloss, device, step.world_size)


def _begin_epoch(
    step: TrainStep,
    device: torch.device,
    loss: torch.Tensor | None,
    start: int,
    nb: int,
    progress: bool,
    progress_seconds: float | None,
) -> tuple[torch.Tensor, EpochStats, Any, _Timer]:
    """The model set to train; the running mean loss (on the device), the stats, progress display and timer."""
    step.model.train()
    mloss = torch.zeros(3, device=device) if loss is None else loss.detach().to(device, torch.float32).clone()
    stats = EpochStats(mloss, batch=start, start=start)
    bar = _progress(nb, start, enabled=progress, interval=progress_seconds)
    timer = _Timer(device)
    step.optimizer.zero_grad()
    return mloss, stats, bar, timer


def _train_batch(
    step: TrainStep,
    stats: EpochStats,
    timer: _Timer,
    batch_imgs: Any,
    targets: torch.Tensor,
    mloss: torch.Tensor,
    i: int,
    ni: int,
    epoch: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Train batch ``i``, no host wait: the images as the step saw them and the running mean with this batch in."""
    timer.batch_ready()
    imgs = step.prepare(batch_imgs, device)
    loss_items = step(imgs, targets, ni, epoch)
    loss_items = torch.where(torch.isfinite(loss_items), loss_items, mloss)  # a skipped step's loss: not in the mean
    mloss = (mloss * i + loss_items) / (i + 1)  # stays on the device
    timer.step_done()
    stats.images += batch_imgs.shape[0]
    stats.batch, stats.loss = i + 1, mloss
    return imgs, mloss


def _show(
    bar: Any,
    last: bool,
    epoch: int,
    epochs: int | None,
    mloss: torch.Tensor,
    device: torch.device,
    targets: torch.Tensor,
    imgs: torch.Tensor,
    world_size: int,
) -> None:
    """Count a batch on the progress display, if any; refresh its text when due (the text reads the loss back)."""
    if bar is None:
        return
    if bar.due() or last:  # a bar: every BAR_SECONDS; plain lines: every PLAIN_SECONDS
        bar.set_description(_describe(epoch, epochs, mloss, device, targets, imgs, world_size))  # a sync
    bar.update(1)  # a plain line, when due, shows the description just set


def _obey(
    control: Any, step: TrainStep, stats: EpochStats, on_save: Callable[[EpochStats], None] | None, ni: int, last: bool
) -> bool:
    """Do what ``control`` says after step ``ni`` (the same on every rank): save and go on, or stop (True)."""
    action = control.after_step(step, boundary=step.last_opt_step == ni, last=last)
    if action is Action.STOP:
        stats.stopped = True
        return True
    if action is Action.SAVE:
        if on_save is not None:
            on_save(stats)
        control.saved()
    return False


def _end_epoch(
    bar: Any,
    timer: _Timer,
    stats: EpochStats,
    epoch: int,
    epochs: int | None,
    mloss: torch.Tensor,
    device: torch.device,
    world_size: int,
) -> EpochStats:
    """The epoch's ``stats``, its times recorded (the timer's one wait for the GPU), after the last progress line."""
    if bar is not None:
        bar.set_description(_describe(epoch, epochs, mloss, device, None, None, world_size))
        bar.close()
    stats.seconds, stats.data_seconds = timer.finish()
    return stats


def _progress(nb: int, start: int, enabled: bool, interval: float | None = None) -> Any:
    """The epoch's progress on the main process: a bar on a terminal, plain lines in a log, or None (off)."""
    mode = progress_mode() if enabled else "off"
    if mode == "off":
        return None
    options = dict(initial=start, interval=interval, bar_format="{l_bar}{bar:10}{r_bar}", file=sys.stderr)
    return progress(nb, mode=mode, **options)


def _describe(
    epoch: int, epochs: int | None, mloss: torch.Tensor, device: torch.device, targets, imgs, world_size: int = 1
) -> str:
    """The progress line's text. Its losses are this rank's (rank 0's) running mean, said so under DDP: the
    epoch line's are the mean over all ranks, and agreeing on them each refresh would cost a collective."""
    box, obj, cls = mloss.tolist()  # CPU-GPU sync point: only when the bar refreshes
    memory = f"{torch.cuda.memory_reserved(device) / 2**30:.2f}G" if device.type == "cuda" else "-"
    whose = "rank 0 " if world_size > 1 else ""
    text = f"{epoch + 1}/{epochs or '?'} mem {memory} {whose}box {box:.4f} obj {obj:.4f} cls {cls:.4f}"
    if targets is not None:
        text += f" inst {targets.shape[0]} size {imgs.shape[-1]}"
    return text
