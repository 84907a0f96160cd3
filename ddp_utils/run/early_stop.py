"""Stop training when the validation fitness has not improved for a number of epochs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..log import LOGGER


class EarlyStopping:
    """Decide after each validation whether training should stop.

    Called the YOLOv5 way too: ``stopper = EarlyStopping(patience=30)``, then each epoch
    ``stop = stopper(epoch=epoch, fitness=fi)`` where ``fi`` may be YOLOv5's one-element array.

    Args:
        patience: epochs without improvement after which to stop; 0 or None never stops.

    Attributes:
        best_fitness: the best fitness seen (None before the first call; YOLOv5 starts at 0.0).
        best_epoch: the epoch that reached it.
        possible_stop: True when the next epoch may stop training (it stops then unless the
            fitness improves), as YOLOv5's train.py reads it to treat that epoch as a final one.
        requeues_on_stop: False: a run stopped by a signal is continued with ``--resume`` (its stop line says
            so); an evolve trial's stopper says True (its study continues it).

    Examples:
        >>> stopper = EarlyStopping(patience=2)
        >>> [stopper(epoch, fit) for epoch, fit in enumerate([0.1, 0.3, 0.2, 0.25, 0.2])]
        [False, False, False, True, True]
        >>> stopper.best_epoch, stopper.possible_stop
        (1, True)
    """

    requeues_on_stop = False

    def __init__(self, patience: int | None = 30) -> None:
        if patience is not None and patience < 0:
            raise ValueError(f"EarlyStopping patience={patience}: must be >= 0 (0 or None: never stop)")
        self.patience = patience or 0
        self.best_fitness: float | None = None
        self.best_epoch = 0
        self.possible_stop = False
        self._reported = False

    def __call__(self, epoch: int, fitness: Any) -> bool:
        """Record ``fitness`` for ``epoch`` and return True when training should stop.

        A fitness equal to the best counts as an improvement (a plateau at the best keeps going).
        None (no validation this epoch) changes nothing. A one-element array (YOLOv5's
        ``fitness(np.array(results).reshape(1, -1))``) counts as its value.
        """
        if fitness is not None:
            fitness = _as_float(fitness)
            if self.best_fitness is None or fitness >= self.best_fitness:
                self.best_fitness, self.best_epoch = fitness, epoch
        if not self.patience:
            return False
        self.possible_stop = epoch - self.best_epoch >= self.patience - 1
        stop = epoch - self.best_epoch >= self.patience
        if stop and not self._reported:
            self._reported = True
            LOGGER.info(
                f"Stopping early: no improvement for {self.patience} epochs; the best fitness "
                f"{self.best_fitness:.5g} was at epoch {self.best_epoch}. "
                "Change the patience with --patience (0 never stops)."
            )
        return stop


def is_new_best(fitness: Any, best_fitness: float, skipped: int = 0) -> bool:
    """Whether an epoch's ``fitness`` makes it the best so far: its weights go to best.pt.

    A fitness equal to the best counts, as YOLOv5's ``>=``. A non-finite fitness never does, nor
    none above 0 from an epoch that skipped optimizer steps as non-finite: that is a diverging
    run's state (NaN or zero metrics over garbage weights), not a model anyone wants.

    Args:
        fitness: the epoch's fitness (one number or YOLOv5's one-element array).
        best_fitness: the best so far.
        skipped: the epoch's optimizer steps skipped as non-finite.

    Examples:
        >>> is_new_best(0.0, 0.0), is_new_best(0.0, 0.0, skipped=2), is_new_best(float("nan"), 0.0)
        (True, False, False)
        >>> is_new_best(0.31, 0.3, skipped=1)
        True
    """
    value = _as_float(fitness)
    if not math.isfinite(value) or (skipped and value <= 0):
        return False
    return value >= best_fitness


def _as_float(fitness: Any) -> float:
    values = np.asarray(fitness, dtype=np.float64)
    if values.size != 1:
        raise ValueError(f"EarlyStopping: fitness must be one number or a one-element array, got shape {values.shape}")
    return float(values.reshape(()))
