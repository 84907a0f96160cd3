"""A run's checkpoint files: :class:`Checkpointer` (``last.pt``, ``best.pt``, ``epochN.pt``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .disk import BackgroundWriter, write_serialised
from .format import build_checkpoint, check_plain, to_plain


class Checkpointer:
    """Own a run's checkpoint files: ``weights/last.pt``, ``best.pt`` and ``epochN.pt``.

    Each :meth:`save` builds the checkpoint once (EMA weights, the raw training weights,
    optimizer, scaler, options, hyperparameters, where training stands) as a snapshot in host
    memory, serialises it once, straight into ``last.pt``'s temp file, and gives every other file
    that is due the same bytes (a hard link, else a copy), each atomically: at once, or in a
    background thread (``background=True``: the caller goes on after the copy; :meth:`wait` for the
    files, and whether they landed). Call it on the process that writes (rank 0). When periodic saves
    are due is the run's control's business (:class:`~ddp_utils.run.control.StepControl`).

    Args:
        save_dir: the run directory; files go to ``save_dir/weights``.
        opt: the run's options (stored in every checkpoint).
        hyp: the hyperparameters the run used (stored as given: the same as ``hyp.yaml``).
        save_period: also keep ``epoch{N}.pt`` every ``save_period`` epochs (<= 0: never).
        background: serialise and write in a thread.

    Examples:
        >>> import tempfile
        >>> import torch
        >>> from torch import nn
        >>> from ddp_utils.engine import ModelEMA, TrainStep
        >>> from ddp_utils.run import TrainState
        >>> model = nn.Linear(2, 1)
        >>> step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), None, ModelEMA(model), None)
        >>> ckpts = Checkpointer(tempfile.mkdtemp(), opt={"epochs": 3}, hyp={"lr0": 0.01}, save_period=1)
        >>> [p.name for p in ckpts.save(TrainState(epoch=1), step, best=True)]  # epoch 0 done: its files
        ['last.pt', 'best.pt', 'epoch0.pt']
    """

    def __init__(
        self,
        save_dir: str | Path,
        opt: Any = None,
        hyp: Mapping[str, Any] | None = None,
        save_period: int = -1,
        background: bool = False,
    ) -> None:
        self.weights_dir = Path(save_dir) / "weights"
        self.last = self.weights_dir / "last.pt"
        self.best = self.weights_dir / "best.pt"
        self.opt = to_plain(opt) if opt is not None else {}
        self.hyp = to_plain(dict(hyp)) if hyp is not None else {}
        self.save_period = int(save_period)
        self.writer = BackgroundWriter() if background else None
        self.blocked_seconds = 0.0  # how long the last save held its caller (the snapshot; the write unless background)

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
        state: Any,
        training: Any,
        *,
        best: bool = False,
        landed: Callable[[float, float], None] | None = None,
        goes_on: bool = True,
    ) -> list[Path]:
        """Write where training stands to last.pt (and best.pt, epochN.pt when due).

        Args:
            state: a :class:`~ddp_utils.run.train_state.TrainState`: the epoch in progress and the batch it
                reached (0: the epochs before it are done and validated; ``epochN.pt`` may then be due),
                the best fitness, and the rest a resume needs. The checkpoint's ``epoch`` is the last
                epoch done (``state.epoch - 1``), as YOLOv5's.
            training: what is trained, as attributes: ``model`` (wrappers are looked through), ``ema``
                (its ``ema.ema`` is the checkpoint's ``model``), ``optimizer`` and ``scaler`` (stored when
                enabled): a :class:`~ddp_utils.engine.TrainStep`.
            best: this epoch is the best so far: also write best.pt.
            landed: called once the files are whole on disk, with the seconds the caller was held (the snapshot,
                and a save still being written before it) and the seconds the write took; in the writer's
                thread with ``background``; never for a save that failed. What says "saved" says it here.
            goes_on: training goes on after it (not the final or a stop's): a failed write says the next is tried.

        Returns:
            The paths written (or being written, in the background).

        Raises:
            CheckpointWriteError: without ``background``, a write failed (the previous file there is
                intact). With ``background`` a failed write is never raised: the writer thread warns
                at once, this save and the next are written as usual, and :meth:`wait` returns False.
        """
        started = time.perf_counter()
        scaler, ema = getattr(training, "scaler", None), training.ema
        enabled = scaler is not None and getattr(scaler, "is_enabled", lambda: True)()
        ckpt = build_checkpoint(
            ema.ema,
            train_model=training.model,
            optimizer=getattr(training, "optimizer", None),
            scaler=scaler if enabled else None,
            ema_updates=ema.updates,
            epoch=state.epoch - 1,
            best_fitness=state.best_fitness,
            opt=self.opt,
            hyp=self.hyp,
            train_state=state.as_dict(),
        )
        paths = self.targets(state.epoch - 1, best, periodic=state.batch == 0)
        if self.writer is not None:
            self.writer.wait()  # the save before it lands first (files never land out of order): part of the hold
            held = time.perf_counter() - started
            self.writer.submit(ckpt, paths, None if landed is None else lambda took: landed(held, took), goes_on)
        else:
            check_plain(ckpt)
            paths = write_serialised(ckpt, paths)
        self.blocked_seconds = time.perf_counter() - started
        if self.writer is None and landed is not None:
            landed(self.blocked_seconds, self.blocked_seconds)
        return paths

    def wait(self) -> bool:
        """Return, when every save is written or has failed, whether the last one is on disk.

        Returns:
            True when the last save landed (always, without ``background``: an inline save that fails
            raises instead), False when a background write failed (already warned about;
            ``writer.last_error`` holds it). ``writer.last_seconds`` is how long it took in its thread.
        """
        return self.writer.wait() if self.writer is not None else True

    @property
    def write_seconds(self) -> float:
        """How long the last save took to serialise and write (in its thread, with ``background``)."""
        return self.writer.last_seconds if self.writer is not None else self.blocked_seconds
