"""A run's checkpoint files: :class:`Checkpointer` (``last.pt``, ``best.pt``, ``epochN.pt``) and its save clock."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .files import BackgroundWriter, write_serialised
from .format import build_checkpoint, check_plain, to_plain


class Checkpointer:
    """Own a run's checkpoint files: ``weights/last.pt``, ``best.pt`` and ``epochN.pt``.

    Each :meth:`save` builds the checkpoint once (EMA weights, the raw training weights,
    optimizer, scaler, options, hyperparameters, the ``TrainState``) as a snapshot in host
    memory, serialises it once, straight into ``last.pt``'s temp file, and gives every other file
    that is due the same bytes (a hard link, else a copy), each atomically: at once, or in a
    background thread (``background=True``: the caller goes on after the copy; :meth:`wait` for the
    files, and whether they landed). Call it on the process that writes (rank 0).

    Args:
        save_dir: the run directory; files go to ``save_dir/weights``.
        opt: the run's options (stored in every checkpoint).
        hyp: the hyperparameters the run used (stored as given: the same as ``hyp.yaml``).
        save_period: also keep ``epoch{N}.pt`` every ``save_period`` epochs (<= 0: never).
        interval_minutes: :meth:`save_due` turns true this long after the last save (<= 0: never).
        background: serialise and write in a thread.

    Examples:
        >>> import tempfile
        >>> from ddp_utils.engine import ModelEMA
        >>> model = nn.Linear(2, 1)
        >>> ckpts = Checkpointer(tempfile.mkdtemp(), opt={"epochs": 3}, hyp={"lr0": 0.01}, save_period=1)
        >>> [p.name for p in ckpts.save(0, model, ModelEMA(model), best=True)]
        ['last.pt', 'best.pt', 'epoch0.pt']
    """

    def __init__(
        self,
        save_dir: str | Path,
        opt: Any = None,
        hyp: Mapping[str, Any] | None = None,
        save_period: int = -1,
        interval_minutes: float = 0.0,
        background: bool = False,
    ) -> None:
        self.weights_dir = Path(save_dir) / "weights"
        self.last = self.weights_dir / "last.pt"
        self.best = self.weights_dir / "best.pt"
        self.opt = to_plain(opt) if opt is not None else {}
        self.hyp = to_plain(dict(hyp)) if hyp is not None else {}
        self.save_period = int(save_period)
        self.interval = max(float(interval_minutes), 0.0) * 60
        self.writer = BackgroundWriter() if background else None
        self.last_saved = time.monotonic()
        self.blocked_seconds = 0.0  # how long the last save held its caller (the snapshot; the write unless background)

    def targets(self, epoch: int, best: bool = False, periodic: bool = True) -> list[Path]:
        """The files a save after ``epoch`` writes: last, then best when ``best``, then epochN when due."""
        paths = [self.last]
        if best:
            paths.append(self.best)
        if periodic and self.save_period > 0 and (epoch + 1) % self.save_period == 0:
            paths.append(self.weights_dir / f"epoch{epoch}.pt")
        return paths

    def save_due(self) -> bool:
        """Whether ``interval_minutes`` have passed since the last save (a periodic mid-epoch save is due)."""
        return self.interval > 0 and time.monotonic() - self.last_saved >= self.interval

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
        state: Any = None,
    ) -> list[Path]:
        """Write the checkpoint of ``epoch`` to last.pt (and best.pt, epochN.pt when due).

        Args:
            epoch: the last finished epoch (-1: none yet).
            model: the model being trained (wrappers are looked through).
            ema: its :class:`~ddp_utils.engine.ModelEMA`; ``ema.ema`` is the checkpoint's ``model``.
            optimizer: its state is stored for resuming.
            scaler: a GradScaler; stored only when enabled.
            best_fitness: the best fitness so far.
            best: this epoch is the best so far: also write best.pt.
            periodic: whether epochN.pt may be due (False for a save in the middle of an epoch).
            state: where training stands (a :class:`~ddp_utils.engine.resume.TrainState`), for a resume
                at the next batch.

        Returns:
            The paths written (or being written, in the background).

        Raises:
            CheckpointWriteError: without ``background``, a write failed (the previous file there is
                intact). With ``background`` a failed write is never raised: the writer thread warns
                at once, this save and the next are written as usual, and :meth:`wait` returns False.
        """
        started = time.perf_counter()
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
            train_state=state.as_dict() if state is not None else None,
        )
        paths = self.targets(epoch, best, periodic)
        if self.writer is not None:
            self.writer.submit(ckpt, paths)
        else:
            check_plain(ckpt)
            paths = write_serialised(ckpt, paths)
        self.last_saved = time.monotonic()
        self.blocked_seconds = time.perf_counter() - started
        return paths

    def wait(self) -> bool:
        """Return, when every save is written or has failed, whether the last one is on disk.

        Returns:
            True when the last save landed (always, without ``background``: an inline save that fails
            raises instead), False when a background write failed (already warned about;
            ``writer.last_error`` holds it). ``writer.last_seconds`` is how long it took in its thread.
        """
        return self.writer.wait() if self.writer is not None else True
