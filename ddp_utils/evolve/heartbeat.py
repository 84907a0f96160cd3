"""A running trial's heartbeat in the study store, beaten from a thread while the trial trains (rank 0 only).

The store (:mod:`.store`) fails a trial whose heartbeat is silent past the grace period and queues its retry:
this is what keeps a trial that trains from looking lost.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import optuna
from optuna.storages import RDBStorage

from ..log import LOGGER
from .store import trial_id


class Heartbeat:
    """A running trial's heartbeat, recorded every ``interval`` seconds from a thread while the trial trains.

    A store that does not answer for a while is logged once; the trial goes on (the heartbeat catches up, or
    another worker fails the trial after the grace period and retries it from its last save).
    """

    def __init__(self, storage: RDBStorage, trial: optuna.Trial, interval: float) -> None:
        self.storage, self.trial_id, self.interval = storage, trial_id(trial), max(float(interval), 0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="evolve-heartbeat", daemon=True)
        self._warned = False

    def __enter__(self) -> Heartbeat:
        self.storage.record_heartbeat(self.trial_id)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception as exc:  # the store is away for a moment: the trial trains on
                if not self._warned:
                    self._warned = True
                    LOGGER.warning(f"evolve: the study store did not take trial {self.trial_id}'s heartbeat: {exc}")


@contextlib.contextmanager
def heartbeat(storage: RDBStorage | None, trial: optuna.Trial | None, interval: float) -> Iterator[None]:
    """:class:`Heartbeat` on the rank that talks to the store; nothing elsewhere."""
    if storage is None or trial is None:
        yield
        return
    with Heartbeat(storage, trial, interval):
        yield


__all__ = ["Heartbeat", "heartbeat"]
