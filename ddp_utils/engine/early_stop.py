"""Stop training when the validation fitness has not improved for a number of epochs."""

from __future__ import annotations

from ..dist import broadcast_object, is_main_process
from ..log import LOGGER


class EarlyStopping:
    """Decide after each validation whether training should stop.

    Args:
        patience: epochs without improvement after which to stop; 0 or None never stops.

    Attributes:
        best_fitness: the best fitness seen (None before the first call).
        best_epoch: the epoch that reached it.

    Examples:
        >>> stopper = EarlyStopping(patience=2)
        >>> [stopper(epoch, fit) for epoch, fit in enumerate([0.1, 0.3, 0.2, 0.25, 0.2])]
        [False, False, False, True, True]
        >>> stopper.best_epoch
        1
    """

    def __init__(self, patience: int | None = 30) -> None:
        if patience is not None and patience < 0:
            raise ValueError(f"EarlyStopping patience={patience}: must be >= 0 (0 or None: never stop)")
        self.patience = patience or 0
        self.best_fitness: float | None = None
        self.best_epoch = 0
        self._reported = False

    def __call__(self, epoch: int, fitness: float | None) -> bool:
        """Record ``fitness`` for ``epoch`` and return True when training should stop.

        A fitness equal to the best counts as an improvement (a plateau at the best keeps going).
        None (no validation this epoch) changes nothing.
        """
        if fitness is not None and (self.best_fitness is None or fitness >= self.best_fitness):
            self.best_fitness, self.best_epoch = float(fitness), epoch
        if not self.patience:
            return False
        stop = epoch - self.best_epoch >= self.patience
        if stop and not self._reported:
            self._reported = True
            LOGGER.info(
                f"Stopping early: no improvement for {self.patience} epochs; the best fitness "
                f"{self.best_fitness:.5g} was at epoch {self.best_epoch}. "
                "Change the patience with --patience (0 never stops)."
            )
        return stop


def should_stop_everywhere(stop: bool) -> bool:
    """Return rank 0's stop decision on every rank (a collective: every rank must call it).

    Examples:
        >>> should_stop_everywhere(True)  # single process: the local decision
        True
    """
    return bool(broadcast_object(bool(stop) if is_main_process() else None, src=0))
