"""Study workers for tests/evolve/test_store.py: real processes sharing one study store, no training.

Each runs the claim loop of ``train.py --evolve`` (``ddp_utils.evolve.store``) with a stand-in for the training
(a short sleep, the trial number as its fitness) and prints one JSON line: the trial numbers it ran.
"""

from __future__ import annotations

import json
import os
import time

import optuna

from ddp_utils.evolve.space import Bound
from ddp_utils.evolve.store import claim, open_storage, open_study

SPACE = {"lr0": Bound(1.0, 1e-5, 0.1)}


def identity(generations: int) -> dict:
    return {"data": {"yaml": "tiny.yaml"}, "space": {"lr0": [1.0, 1e-5, 0.1]}, "generations": generations,
            "hyp": {"lr0": 0.01}}  # fmt: skip


def study_for(url: str, name: str, generations: int, heartbeat: float = 60.0):
    storage = open_storage(url, heartbeat)
    study = open_study(storage, name, identity(generations), {"lr0": 0.01}, optuna.samplers.RandomSampler(0),
                       optuna.pruners.NopPruner())  # fmt: skip
    return storage, study


def claim_loop(url: str, name: str, generations: str, seconds: str) -> None:
    """Run trials until none is left: claim, "train" for ``seconds``, tell its number as the fitness."""
    storage, study = study_for(url, name, int(generations))
    ran = []
    while (trial := claim(study, storage, f"pid={os.getpid()}")) is not None:
        trial.suggest_float("lr0", 1e-5, 0.1)
        time.sleep(float(seconds))
        study.tell(trial, float(trial.number))
        ran.append(trial.number)
    print(json.dumps({"pid": os.getpid(), "ran": ran}), flush=True)


def claim_and_vanish(url: str, name: str, generations: str, heartbeat: str) -> None:
    """Claim one trial, beat its heartbeat once, and leave without a word (as a worker killed hard)."""
    storage, study = study_for(url, name, int(generations), float(heartbeat))
    trial = claim(study, storage, "gone")
    trial.suggest_float("lr0", 1e-5, 0.1)
    trial.set_user_attr("dir", "/nonexistent/trials/0")
    print(json.dumps({"claimed": trial.number}), flush=True)
    os._exit(0)
