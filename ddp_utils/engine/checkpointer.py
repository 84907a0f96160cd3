"""The checkpoint files of one run: :class:`Checkpointer` (``last.pt``, ``best.pt``, ``epochN.pt``)."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..distributed import is_main_process
from ..log import LOGGER
from .checkpoint_io import atomic_write_bytes, build_checkpoint, check_plain, to_plain


class Checkpointer:
    """Own a run's checkpoint files: ``weights/last.pt``, ``best.pt`` and ``epochN.pt``.

    Each :meth:`save` builds the checkpoint once (EMA weights, the raw training weights,
    optimizer, scaler, options, hyperparameters), serialises it once, and writes the same
    bytes atomically to every file that is due. Only the main process writes; elsewhere
    :meth:`save` returns an empty list at once, so every rank may call it.

    Args:
        save_dir: the run directory; files go to ``save_dir/weights``.
        opt: the run's options (stored in every checkpoint).
        hyp: the hyperparameters the run used (stored as given: the same as ``hyp.yaml``).
        save_period: also keep ``epoch{N}.pt`` every ``save_period`` epochs (<= 0: never).

    Examples:
        >>> import tempfile
        >>> from ddp_utils.engine import ModelEMA
        >>> model = nn.Linear(2, 1)
        >>> ckpts = Checkpointer(tempfile.mkdtemp(), opt={"epochs": 3}, hyp={"lr0": 0.01}, save_period=1)
        >>> [p.name for p in ckpts.save(0, model, ModelEMA(model), best=True)]
        ['last.pt', 'best.pt', 'epoch0.pt']
    """

    def __init__(
        self, save_dir: str | Path, opt: Any = None, hyp: Mapping[str, Any] | None = None, save_period: int = -1
    ) -> None:
        self.weights_dir = Path(save_dir) / "weights"
        self.last = self.weights_dir / "last.pt"
        self.best = self.weights_dir / "best.pt"
        self.opt = to_plain(opt) if opt is not None else {}
        self.hyp = to_plain(dict(hyp)) if hyp is not None else {}
        self.save_period = int(save_period)

    def targets(self, epoch: int, best: bool = False, periodic: bool = True) -> list[Path]:
        """The files a save after ``epoch`` writes: last, then best when ``best``, then epochN when due."""
        paths = [self.last]
        if best:
            paths.append(self.best)
        if periodic and self.save_period > 0 and (epoch + 1) % self.save_period == 0:
            paths.append(self.weights_dir / f"epoch{epoch}.pt")
        return paths

    def save(
        self,
        epoch: int,
        model: nn.Module,
        ema: Any,
        optimizer: torch.optim.Optimizer | None = None,
        scaler: Any | None = None,
        best_fitness: float = 0.0,
        best: bool = False,
        periodic: bool = True,
    ) -> list[Path]:
        """Write the checkpoint of ``epoch`` to last.pt (and best.pt, epochN.pt when due).

        Args:
            epoch: the last finished epoch (-1: none yet; resuming redoes epoch 0).
            model: the model being trained (wrappers are looked through).
            ema: its :class:`~ddp_utils.engine.ModelEMA`; ``ema.ema`` is the checkpoint's ``model``.
            optimizer: its state is stored for resuming.
            scaler: a GradScaler; stored only when enabled.
            best_fitness: the best fitness so far.
            best: this epoch is the best so far: also write best.pt.
            periodic: whether epochN.pt may be due (False for a save of an interrupted epoch).

        Returns:
            The paths written (empty on other ranks).

        Raises:
            CheckpointWriteError: a write failed; the previous file there is intact.
        """
        if not is_main_process():
            return []
        enabled = scaler is not None and getattr(scaler, "is_enabled", lambda: True)()
        ckpt = build_checkpoint(
            ema.ema,
            train_model=model,
            optimizer=optimizer,
            scaler=scaler if enabled else None,
            ema_updates=ema.updates,
            epoch=epoch,
            best_fitness=best_fitness,
            opt=self.opt,
            hyp=self.hyp,
        )
        check_plain(ckpt)
        buffer = io.BytesIO()
        torch.save(ckpt, buffer)
        data = buffer.getvalue()
        return [atomic_write_bytes(data, path) for path in self.targets(epoch, best, periodic)]

    def save_interrupted(
        self,
        epoch: int,
        model: nn.Module,
        ema: Any,
        optimizer: torch.optim.Optimizer | None = None,
        scaler: Any | None = None,
        best_fitness: float = 0.0,
    ) -> list[Path]:
        """Save after a signal stopped ``epoch`` midway: to last.pt, as epoch ``epoch - 1``, so a resume redoes it.

        Every rank may call it (only the main process writes); each logs how to continue.

        Returns:
            The paths written (empty on other ranks).
        """
        written = self.save(epoch - 1, model, ema, optimizer, scaler, best_fitness, periodic=False)
        LOGGER.warning(
            f"stopped by a signal during epoch {epoch + 1}: saved {self.last}; "
            f"continue with: python train.py --resume {self.last}"
        )
        return written
