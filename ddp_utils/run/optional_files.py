"""What a run can do without: its plots (labels.jpg, train_batch*.jpg, results.png, best.pt stripped of its
optimizer), results.csv's rows and TensorBoard's events. A disk that fills up at any moment, epoch 1 included, must
not end a run for one of them: a write that fails (ENOSPC, or any other OSError) is one warning, the first time, and
the run goes on; those that fail after it say nothing more (a full disk fails them all, and the log would fill with
the same line). Checkpoints are not optional: a save that fails is :class:`~ddp_utils.run.saves.RunSaves`'s (one
warning each, and a final or stop save that fails ends the run with exit code 74). The trackers drop themselves on
their own first failure (:class:`~ddp_utils.run.trackers.Trackers`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..log import LOGGER

T = TypeVar("T")


class OptionalFiles:
    """A run's optional writes, each through :meth:`write`: the first that fails is one warning, the run goes on.

    Attributes:
        failures: how many optional writes failed so far.

    Examples:
        >>> optional = OptionalFiles()
        >>> def full_disk():
        ...     raise OSError(28, "No space left on device")
        >>> optional.write("runs/exp/labels.jpg", full_disk), optional.write("runs/exp/results.png", full_disk)
        (None, None)
        >>> optional.failures, optional.write("runs/exp/results.csv", lambda: "written")
        (2, 'written')
    """

    def __init__(self) -> None:
        self.failures = 0

    def write(self, path: str | Path, write: Callable[[], T], what: str = "") -> T | None:
        """``write()``'s result, or None when it raised an OSError (said once, for the first: :meth:`failed`).

        Args:
            path: the file it writes (the warning names it).
            write: the write.
            what: what the warning adds after the path (``" without its optimizer"``).
        """
        try:
            return write()
        except OSError as exc:
            self.failed(path, exc, what)
            return None

    def failed(self, path: str | Path, exc: OSError, what: str = "") -> None:
        """Count an optional write that failed with ``exc``; the first is one warning naming the file and why."""
        self.failures += 1
        if self.failures == 1:
            LOGGER.warning(
                f"could not write {path}{what}: {exc.strerror or exc}; it is optional, so the run goes on (the "
                "optional files that fail after it, plots, results.csv rows and TensorBoard events, say nothing more; "
                "checkpoints are not optional)"
            )


__all__ = ["OptionalFiles"]
