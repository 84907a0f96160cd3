"""What a run says and draws: the epoch line (:func:`epoch_line`, parsed by :data:`EPOCH_LINE`), the first
batches' mosaics (:func:`first_batches_plotter`) and the finished run's last words (:func:`finish_run`).

The epoch line is the one record of an epoch in the log; benchmarks read its stable ending
(``N img/s, data wait P%``) through :data:`EPOCH_LINE` and :func:`parse_epoch_lines`, so the
format and its parser live here together.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..log import LOGGER
from .checkpoint import strip_optimizer
from .optional_files import OptionalFiles
from .plots import plot_images, plot_results

EPOCH_LINE = re.compile(r"\bepoch (\d+)/\d+: [^\n]*?([0-9.]+) img/s, data wait ([0-9.]+)%")


def epoch_line(epoch: int, epochs: int, train_loss: torch.Tensor, metrics: Mapping[str, float], speed: str) -> str:
    """The log line of one finished epoch (``epoch`` counts from 0; the line from 1).

    Args:
        epoch: the epoch just trained.
        epochs: the run's epochs.
        train_loss: the epoch's mean (box, obj, cls) loss over all ranks.
        metrics: ``precision``, ``recall``, ``map50``, ``map`` of the last validation.
        speed: :meth:`~ddp_utils.engine.EpochStats.speed`'s ``"N img/s, data wait P%"``.

    Examples:
        >>> metrics = {"precision": 0.5, "recall": 0.25, "map50": 0.4, "map": 0.2}
        >>> line = epoch_line(1, 3, torch.tensor([0.1, 0.2, 0.3]), metrics, "812.5 img/s, data wait 0.2%")
        >>> line.startswith("epoch 2/3: loss 0.1000 0.2000 0.3000, P 0.500 R 0.250 mAP@0.5 0.400")
        True
        >>> line.endswith(" mAP@0.5:0.95 0.200, 812.5 img/s, data wait 0.2%")
        True
        >>> parse_epoch_lines(line)
        [{'epoch': 2, 'img_s': 812.5, 'data_wait_share': 0.002}]
    """
    box, obj, cls = train_loss.tolist()
    return (
        f"epoch {epoch + 1}/{epochs}: loss {box:.4f} {obj:.4f} {cls:.4f}, P {metrics['precision']:.3f} "
        f"R {metrics['recall']:.3f} mAP@0.5 {metrics['map50']:.3f} mAP@0.5:0.95 {metrics['map']:.3f}, {speed}"
    )


def epoch_speed(stats: Any, world_size: int = 1) -> str:
    """The epoch line's speed (:meth:`~ddp_utils.engine.EpochStats.speed`), or, for a resumed epoch whose every
    batch was trained before the stop (a stop during its validation), that it has no speed of its own here.

    Examples:
        >>> import torch
        >>> from ddp_utils.engine import EpochStats
        >>> epoch_speed(EpochStats(torch.zeros(3), batch=8, images=64, seconds=2.0))
        '32.0 img/s, data wait 0.0%'
        >>> epoch_speed(EpochStats(torch.zeros(3), batch=8, start=8))
        'every batch trained before the stop'
    """
    return stats.speed(world_size) if stats.images else "every batch trained before the stop"


def epoch_notes(epoch: int, stats: Any, skipped: int) -> str:
    """What the epoch line adds after its speed: a resumed epoch's first batch, steps skipped as non-finite.

    Examples:
        >>> from types import SimpleNamespace
        >>> epoch_notes(2, SimpleNamespace(start=4, batch=8), 1)
        '; resumed at epoch 3, batch 4/8; 1 optimizer step(s) skipped (non-finite gradients)'
    """
    resumed = f"; resumed at epoch {epoch + 1}, batch {stats.start}/{stats.batch}" if stats.start else ""
    return resumed + (f"; {skipped} optimizer step(s) skipped (non-finite gradients)" if skipped else "")


def parse_epoch_lines(text: str) -> list[dict]:
    """Per-epoch figures from a log's epoch lines: ``epoch`` (from 1), ``img_s``, ``data_wait_share`` (0-1)."""
    return [
        {"epoch": int(m.group(1)), "img_s": float(m.group(2)), "data_wait_share": float(m.group(3)) / 100}
        for m in EPOCH_LINE.finditer(text)
    ]


def first_batches_plotter(
    save_dir: Path, names: Mapping[int, str], enabled: bool = True, n: int = 3, optional: OptionalFiles | None = None
) -> Callable[[int, torch.Tensor, torch.Tensor, list[str]], None] | None:
    """A :func:`~ddp_utils.engine.train_one_epoch` ``on_batch`` callback drawing batches 0..n-1 to train_batch{i}.jpg.

    Returns None when not ``enabled`` (other ranks, ``--noplots``, epochs after the first), so
    the loop has no callback to call at all. The pictures are optional (``optional``: the run's
    :class:`~ddp_utils.run.optional_files.OptionalFiles`): one a full disk refuses is a warning, and training goes on.
    """
    if not enabled:
        return None
    optional = optional or OptionalFiles()

    def plot(i: int, imgs_uint8: torch.Tensor, targets: torch.Tensor, paths: list[str]) -> None:
        if i < n:
            path = Path(save_dir) / f"train_batch{i}.jpg"
            optional.write(path, lambda: plot_images(imgs_uint8, targets, path, paths, dict(names)))

    return plot


def finish_run(
    save_dir: str | Path,
    metrics: Mapping[str, float],
    epochs_done: int,
    plots: bool = True,
    optional: OptionalFiles | None = None,
) -> None:
    """A finished run's last words: best.pt stripped of its optimizer, results.png drawn (``plots``), the final line.

    It writes wherever it is called: the caller calls it on one process (train.py: the main one), after
    the last epoch (not after a preemption: that run goes on). Both writes are optional (``optional``: the run's
    :class:`~ddp_utils.run.optional_files.OptionalFiles`): on a full disk best.pt keeps its optimizer (the same
    weights), results.png is not drawn, and the final line still comes.
    """
    save_dir, optional = Path(save_dir), optional or OptionalFiles()
    best = save_dir / "weights" / "best.pt"
    if best.exists():
        optional.write(best, lambda: strip_optimizer(best), " without its optimizer (it keeps it)")
    if plots:
        optional.write(save_dir / "results.png", lambda: plot_results(save_dir / "results.csv"))
    LOGGER.info(
        f"{epochs_done} epoch{'' if epochs_done == 1 else 's'} done; results in {save_dir}; "
        f"final mAP@0.5 {metrics['map50']:.3f}, mAP@0.5:0.95 {metrics['map']:.3f}"
    )


__all__ = [
    "EPOCH_LINE",
    "epoch_line",
    "epoch_notes",
    "epoch_speed",
    "finish_run",
    "first_batches_plotter",
    "parse_epoch_lines",
]
