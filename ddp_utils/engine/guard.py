"""Keep a non-finite step out of the weights: skipped on the device, counted, and read on the host later.

A loss or gradient that turns non-finite (an exploding learning rate, a bad sample, fp32 or bf16
runs without a GradScaler to catch it) would go into the weights, the EMA and BatchNorm's running
statistics, and the run would train on NaN to its end. :class:`NonFiniteGuard` decides per
optimizer step, on the device, from one flag: a loss of the accumulation window, or the gradients'
total norm (the same number on every rank: the gradients are all-reduced before it is taken), is not
finite. Nothing waits for the host, and the flag decides all of:

- the optimizer step is skipped: a fused optimizer takes the decision as its ``found_inf`` tensor
  (the mechanism GradScaler uses); a non-fused optimizer (the CPU's default) reads the flag back, a
  wait only a GPU would feel. Under fp16 the GradScaler unscales first and updates its scale after, so
  its overflows (non-finite unscaled gradients) are skipped by the same flag;
- BatchNorm's running statistics, which a forward pass over non-finite activations has already
  spoiled, go back to their values before the accumulation window: they live in one flat tensor
  (each layer's buffers are views into it), saved by one copy and put back by one ``where``;
- the EMA is then updated towards weights that did not change, so nothing non-finite reaches it.

- the step is counted: the guard counts skipped steps (in all, and in a row; the GradScaler's overflows
  too) in a device tensor, :attr:`NonFiniteGuard.counts`.

The run's control (:mod:`ddp_utils.run.control`) reads the counts on the host a step or two later,
without a wait, and stops the run when the steps in a row reach its limit: a persistent fp16 overflow
(the scale halving at every step) stops it as any other divergence does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..distributed.parallel import de_parallel

SKIPPED, IN_A_ROW, OVERFLOWS = 0, 1, 2  # the indices of NonFiniteGuard.counts


class TrainingDiverged(RuntimeError):
    """Optimizer steps stayed non-finite: the run stopped, its last.pt holds the last finite state."""


class FlatBatchNormStats:
    """Every BatchNorm layer's running mean and variance as views into one flat tensor, saved and restored whole.

    BatchNorm updates its running statistics in place, so the views keep their storage. Build it
    after every conversion that replaces buffers (``.to()``, ``.float()``, SyncBatchNorm): those
    would put separate tensors back. ``num_batches_tracked`` is left out: it counts forwards and is
    only read when ``momentum`` is None.

    Examples:
        >>> model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
        >>> stats = FlatBatchNormStats(model)
        >>> stats.flat.numel(), model[1].running_mean.data_ptr() == stats.flat.data_ptr()
        (8, True)
        >>> stats.save(); _ = model(torch.randn(2, 3, 4, 4) * float("nan"))
        >>> stats.restore_unless(torch.tensor(False)); bool(model[1].running_mean.isfinite().all())
        True
    """

    def __init__(self, model: nn.Module) -> None:
        views = [
            (module, name)
            for module in de_parallel(model).modules()
            if isinstance(module, _BatchNorm) and module.track_running_stats
            for name in ("running_mean", "running_var")
            if module._buffers.get(name) is not None
        ]
        tensors = [module._buffers[name] for module, name in views]
        if not tensors:
            self.flat = self.backup = None
            return
        if len({(t.dtype, t.device) for t in tensors}) > 1:
            raise ValueError(
                "FlatBatchNormStats: the BatchNorm buffers differ in dtype or device; convert the model first"
            )
        self.flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        offset = 0
        for (module, name), tensor in zip(views, tensors):
            module._buffers[name] = self.flat[offset : offset + tensor.numel()].view_as(tensor)
            offset += tensor.numel()
        self.backup = torch.empty_like(self.flat)

    def save(self) -> None:
        """Remember the statistics as they are (one copy)."""
        if self.flat is not None:
            self.backup.copy_(self.flat)

    def restore_unless(self, ok: torch.Tensor) -> None:
        """Put the saved statistics back unless ``ok`` (a bool tensor on the device; no host read)."""
        if self.flat is not None:
            torch.where(ok, self.flat, self.backup, out=self.flat)


def _is_fused(optimizer: torch.optim.Optimizer) -> bool:
    return bool(optimizer.defaults.get("fused")) and getattr(optimizer, "_step_supports_amp_scaling", False)


class NonFiniteGuard:
    """Skip optimizer steps whose loss or gradients are not finite, on the device, and count them.

    Call :meth:`before_forward` before each forward, :meth:`check_loss` after it, and
    :meth:`optimizer_step` in place of the optimizer (and scaler) step that ends an accumulation window.

    Args:
        model: the model being trained (wrappers are looked through; build the guard after them).
        device: where the counts live.

    Attributes:
        counts: a float tensor on ``device``: ``[steps skipped in all, steps skipped in a row, of all those the
            GradScaler's overflows]`` (an overflow: finite losses, gradients that overflowed fp16; the scaler's
            routine while it lowers its scale to fit, a fault when it goes on).

    Examples:
        >>> model = nn.Linear(2, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> guard = NonFiniteGuard(model, torch.device("cpu"))
        >>> before = model.weight.detach().clone()
        >>> guard.before_forward(); loss = model(torch.ones(1, 2)).sum() * float("inf"); guard.check_loss(loss)
        >>> loss.backward(); guard.optimizer_step(optimizer, None, torch.tensor(float("nan")))
        >>> torch.equal(model.weight, before), guard.counts.tolist()
        (True, [1.0, 1.0, 0.0])
    """

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.stats = FlatBatchNormStats(model)
        self.counts = torch.zeros(3, device=device)
        self._loss_ok: torch.Tensor | None = None  # None: no accumulation window open

    def before_forward(self) -> None:
        """Before each forward: the first of an accumulation window remembers BatchNorm's statistics."""
        if self._loss_ok is None:
            self.stats.save()
            self._loss_ok = torch.ones((), dtype=torch.bool, device=self.counts.device)

    def check_loss(self, loss: torch.Tensor) -> None:
        """Note whether this forward's loss is finite (on the device)."""
        self._loss_ok = self._loss_ok & torch.isfinite(loss.detach()).all()

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scaler: Any, total_norm: torch.Tensor) -> None:
        """The optimizer step, and the scaler's update, deciding from one flag on the device.

        A window is bad when one of its losses or the gradients' ``total_norm`` (taken after
        ``scaler.unscale_``: an fp16 overflow makes it non-finite, as it makes the scaler skip) is not finite.
        A bad window's step is skipped, BatchNorm's statistics go back to their values before it, and it is
        counted; all three from the same flag. A GradScaler's own skip (an fp16 overflow, its scale halving)
        so counts as well: a persistent overflow reaches the run's limit of skips in a row like any other.
        """
        grads_ok = torch.isfinite(total_norm)
        loss_ok = self._loss_ok if self._loss_ok is not None else torch.ones_like(grads_ok)
        ok = grads_ok & loss_ok
        _step_unless(optimizer, ok)
        scaled = scaler is not None and scaler.is_enabled()
        if scaled:  # halves its scale when unscale_ found non-finite gradients
            scaler.update()
        self.stats.restore_unless(ok)
        bad = (~ok).float()
        self.counts[SKIPPED] += bad
        self.counts[IN_A_ROW] = (self.counts[IN_A_ROW] + bad) * bad
        if scaled:
            self.counts[OVERFLOWS] += (loss_ok & ~grads_ok).float()
        self._loss_ok = None


def _step_unless(optimizer: torch.optim.Optimizer, ok: torch.Tensor) -> None:
    """``optimizer.step()`` unless ``ok`` (a bool tensor) is False; the gradients are unscaled already.

    A fused optimizer takes the decision as GradScaler hands it over, its ``found_inf`` tensor: nothing is read
    back. A non-fused one reads the flag (GradScaler's ``step`` reads its own the same way).
    """
    if _is_fused(optimizer):
        optimizer.grad_scale, optimizer.found_inf = None, (~ok).float()
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale, optimizer.found_inf
    elif bool(ok):  # CPU-GPU sync point for a non-fused optimizer (on the CPU, the default: free)
        optimizer.step()


class HostCounts:
    """The latest value of a small float32 device tensor on the host, copied without waiting for the device.

    On a GPU each :meth:`refresh` starts a non-blocking copy into pinned host memory once the previous
    one has landed (a CUDA event says so without waiting), so :attr:`values` trails the device by a
    step or two; on the CPU it is current. :meth:`exact` waits: for the epoch's end.

    Examples:
        >>> counts = torch.tensor([2.0, 1.0])
        >>> host = HostCounts(counts)
        >>> host.refresh(); host.values.tolist()
        [2.0, 1.0]
    """

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.cuda = tensor.device.type == "cuda"
        if self.cuda:  # pinned, so the copy runs without blocking; its numpy view is host memory (no wait)
            self._buffer = torch.zeros(tensor.shape, dtype=torch.float32, pin_memory=True)
            self._view = self._buffer.numpy()
        else:  # the array first, the tensor on its memory: read without a tensor op
            self._view = np.zeros(tuple(tensor.shape), dtype=np.float32)
            self._buffer = torch.from_numpy(self._view)
        self._event: Any = None
        self.values = np.zeros(tuple(tensor.shape), dtype=np.float32)

    def refresh(self) -> None:
        """Take the last copy that landed, and start the next one."""
        if self.cuda:
            if self._event is not None and not self._event.query():
                return  # the previous copy is still on its way: keep the older values
            self.values = self._view.copy()
            self._buffer.copy_(self.tensor, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:  # a copy between host tensors, then a read of its memory: no tensor read that a GPU would wait on
            self._buffer.copy_(self.tensor)
            self.values = self._view.copy()

    def exact(self) -> np.ndarray:
        """The tensor's current value (waits for the device: a CPU-GPU sync point)."""
        self.values = self.tensor.detach().cpu().numpy().copy()
        return self.values
