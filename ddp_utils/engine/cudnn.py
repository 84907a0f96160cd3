"""cuDNN's algorithm choice for the training convolutions: heuristics (the default), autotuning, or autotuning ahead.

With ``torch.backends.cudnn.benchmark`` cuDNN times every algorithm of every convolution (forward, data
gradient, weight gradient) the first time it meets an input shape, dtype and layout, and keeps the fastest.
On a GPU that costs a stall per new shape: measured on an H200 (yolov5s, 640 px, batch 64, fp16
channels_last), the first step took 21 s (issue 40). A run meets more shapes than the first batch: the
last, shorter batch of an epoch, every ``--multi-scale`` size, each ``--rect`` batch, each ``--evolve``
trial in a new process; validation never tunes (:func:`ddp_utils.yolo.evaluate`).

The three modes (train.py's ``--cudnn-benchmark``):

- ``off`` (default): cuDNN's heuristics pick an algorithm at once, as YOLOv5 trains (it never sets
  ``benchmark``). No stall, whatever the shapes. What tuning would gain per step is not known without a
  GPU: ``benchmarks/gpu/gpu_check.py`` measures the steady epoch in each mode on the card, and the default
  changes where tuning pays for its stall over a short run.
- ``on``: autotune each shape when the step first meets it (``benchmark_limit`` caps the algorithms tried).
- ``warm``: ``on``, and the training shape is tuned on a synthetic batch before the first step, on a copy
  of the model in a background thread, while the loader's workers make their first batches
  (:func:`warm_up_convolutions`); the first step waits for it.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..log import LOGGER
from .amp import AMP_DTYPES

CUDNN_MODES = ("off", "on", "warm")


MAX_BENCHMARK_LIMIT = 2**31 - 1  # cuDNN keeps the limit in a C int: torch wraps a larger one (2**40 -> 0, "all")
BENCHMARK_LIMIT_ADVICE = f"give the algorithms to try per convolution, 0 for all, at most {MAX_BENCHMARK_LIMIT}"


def set_cudnn_tuning(mode: str = "off", deterministic: bool = False, limit: int | None = None) -> None:
    """Set cuDNN's algorithm choice for this process: heuristics (``off``) or autotuning (``on``, ``warm``).

    ``deterministic`` wins over tuning (cuDNN's deterministic algorithms, untimed), as ``--deterministic``
    asks. Call it with the same arguments on every rank: a DDP job runs at its slowest rank's pace.

    Args:
        mode: one of :data:`CUDNN_MODES`.
        deterministic: cuDNN's deterministic algorithms only, and no tuning.
        limit: most algorithms cuDNN times per convolution (``torch.backends.cudnn.benchmark_limit``;
            0: all of them); None keeps torch's (10).

    Raises:
        ValueError: an unknown mode, or a limit that is negative or past cuDNN's int (:data:`MAX_BENCHMARK_LIMIT`:
            torch would store 2**31 as a negative number, 2**40 as 0, "all").

    Examples:
        >>> set_cudnn_tuning("on"); torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
        (True, False)
        >>> set_cudnn_tuning("warm", deterministic=True); torch.backends.cudnn.benchmark
        False
        >>> set_cudnn_tuning(); torch.backends.cudnn.benchmark
        False
    """
    if mode not in CUDNN_MODES:
        raise ValueError(f"--cudnn-benchmark {mode}: choose one of {', '.join(CUDNN_MODES)}")
    if limit is not None and not 0 <= limit <= MAX_BENCHMARK_LIMIT:
        raise ValueError(f"--cudnn-benchmark-limit {limit}: {BENCHMARK_LIMIT_ADVICE}")
    torch.backends.cudnn.benchmark = mode != "off" and not deterministic
    torch.backends.cudnn.deterministic = deterministic
    if limit is not None:
        torch.backends.cudnn.benchmark_limit = limit


@dataclass
class ConvWarmUp:
    """A warm-up of the convolutions: ``shape`` the synthetic batch, ``seconds`` what it took once done,
    ``gradients`` the parameter gradients its backward computed, ``error`` why it failed (or None)."""

    shape: tuple[int, ...]
    seconds: float | None = None
    gradients: int = 0
    error: str | None = None
    thread: threading.Thread | None = None

    def wait(self) -> None:
        """Block until the warm-up is done (at once when it ran in the foreground)."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None


def bare_model(model: nn.Module) -> nn.Module:
    """The model under DDP's and torch.compile's wrappers (in either order)."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def warm_up_convolutions(
    step: Any,
    shape: tuple[int, ...],
    device: torch.device | str,
    *,
    mode: str = "warm",
    background: bool = True,
) -> ConvWarmUp | None:
    """Tune the step's convolutions for a batch of ``shape`` before the first step; None (nothing done) unless
    ``mode`` is ``warm`` on a CUDA device with autotuning on (:func:`run_warm_up` runs on any device).

    The work runs on a copy of the bare model (no DDP hooks, no collectives, its BatchNorm layers in eval
    mode so SyncBatchNorm gathers nothing), in the step's precision and memory layout: a forward and a
    backward to every trainable parameter, on a constant batch (no random draw). The run's weights,
    gradients, optimizer state, BatchNorm statistics and generators are never touched. With
    ``background`` it runs in a thread, and the step waits for it before its first forward
    (``step.wait_for``), so the tuning times no kernel of the step's.

    Args:
        step: the :class:`~ddp_utils.engine.TrainStep` (its model, ``amp`` and ``channels_last``).
        shape: the training batch, ``(batch, 3, height, width)`` on this rank.
        device: the training device.
        mode: train.py's ``--cudnn-benchmark`` (:data:`CUDNN_MODES`).
        background: run in a thread while the caller goes on (the loader's workers start).
    """
    device = torch.device(device)
    if mode != "warm" or device.type != "cuda" or not torch.backends.cudnn.benchmark:
        return None
    return run_warm_up(step, shape, device, background=background)


def run_warm_up(step: Any, shape: tuple[int, ...], device: torch.device, background: bool = False) -> ConvWarmUp:
    """The warm-up of :func:`warm_up_convolutions`, on any device (the CPU tests run it); the step waits for it."""
    warm = ConvWarmUp(tuple(shape))
    try:  # on the caller's thread: nothing else runs on the model yet
        model = copy.deepcopy(bare_model(step.model))
    except Exception as exc:  # a module that holds what cannot be copied (a process group): no warm-up
        warm.error = f"{type(exc).__name__}: {exc}"
        LOGGER.warning(f"cuDNN warm-up skipped: the model could not be copied ({warm.error}); the first step tunes")
        return warm

    def work() -> None:
        try:
            start = time.perf_counter()
            warm.gradients = _forward_backward(model, warm.shape, device, step.amp, step.channels_last)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # CPU-GPU sync point: once, so the time is the tuning's
            warm.seconds = time.perf_counter() - start
            LOGGER.info(f"cuDNN: tuned the convolutions for a {list(warm.shape)} batch in {warm.seconds:.1f} s")
        except Exception as exc:  # the step tunes at its first forward instead; it reports a real fault itself
            warm.error = f"{type(exc).__name__}: {exc}"
            LOGGER.warning(f"cuDNN warm-up failed ({warm.error}); the first step tunes instead")

    if background:
        warm.thread = threading.Thread(target=work, name="cudnn-warm-up", daemon=True)
        warm.thread.start()
    else:
        work()
    step.wait_for = warm.wait
    return warm


def _forward_backward(model: nn.Module, shape: tuple[int, ...], device: torch.device, amp: str, layout: bool) -> int:
    """One forward and backward of ``model`` (a copy) on a constant batch; returns the gradients computed."""
    model.train()
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()  # no statistics, no SyncBatchNorm collective: the convolutions are what is tuned
    memory_format = torch.channels_last if layout else torch.contiguous_format
    images = torch.full(shape, 0.5, device=device).contiguous(memory_format=memory_format)
    trainable = [p for p in model.parameters() if p.requires_grad]
    with torch.autocast(device.type, dtype=AMP_DTYPES[amp], enabled=amp != "off"):
        out = model(images)
        outputs = out if isinstance(out, (list, tuple)) else [out]
        total = sum(o.float().mean() for o in outputs if isinstance(o, torch.Tensor))
    grads = torch.autograd.grad(total, trainable, allow_unused=True)  # .grad untouched: nothing accumulates
    return sum(g is not None for g in grads)


__all__ = [
    "BENCHMARK_LIMIT_ADVICE",
    "CUDNN_MODES",
    "MAX_BENCHMARK_LIMIT",
    "ConvWarmUp",
    "run_warm_up",
    "set_cudnn_tuning",
    "warm_up_convolutions",
]
