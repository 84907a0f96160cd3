"""Hyperparameter evolution (``train.py --evolve [N]``): YOLOv5's search, its trials in an Optuna study store.

What lives where:

- ``space.py``: the search space: YOLOv5's table of gains and limits, ``--evolve-hyps``, clipping and rounding.
- ``mutation.py``: YOLOv5's mutation as an Optuna sampler (:class:`YOLOv5Sampler`).
- ``store.py``: the study store (SQLite in the evolve directory, or a PostgreSQL URL), the study's N slots,
  claiming the next trial atomically, a stopped trial back in the queue; ``heartbeat.py``: a running trial's
  heartbeat.
- ``settings.py``: what the ``--evolve-*`` options settle (:class:`EvolveSettings`).
- ``trial.py``: one trial: its train.py options, its pruning (:class:`TrialStopper`).
- ``records.py``: evolve.csv, hyp_evolve.yaml and evolve.png, in YOLOv5's forms, written from the study.
- ``study.py``: :func:`evolve`, the loop a worker runs: claim, train, record, until no trial is left.

Above ``engine/``: a trial is one run of train.py's ``train_run``, which :func:`evolve` is handed; nothing here
imports train.py.
"""

from .mutation import YOLOv5Sampler, mutate
from .records import read_evolve_csv
from .settings import EvolveSettings
from .space import YOLOV5_SPACE, Bound, SearchSpaceError, search_space
from .store import StoreError, open_storage
from .study import evolve, open_evolution
from .trial import TrialStopper

__all__ = [
    "YOLOV5_SPACE",
    "Bound",
    "EvolveSettings",
    "SearchSpaceError",
    "StoreError",
    "TrialStopper",
    "YOLOv5Sampler",
    "evolve",
    "mutate",
    "open_evolution",
    "open_storage",
    "read_evolve_csv",
    "search_space",
]
