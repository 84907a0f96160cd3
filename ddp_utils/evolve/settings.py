"""What ``train.py --evolve``'s options settle before anything is written (:class:`EvolveSettings`).

The options themselves are train.py's, with the others: :func:`ddp_utils.run.options.add_evolve_options`.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import optuna

from ..distributed import stall_timeout_from_env
from ..hyp import load_hyp
from ..run.option_checks import MAX_HEARTBEAT, chosen
from ..yamls import find_yaml, read_yaml
from .mutation import YOLOv5Sampler
from .space import Bound, constrain, search_space, space_record
from .store import default_storage_url, grace_period

DEFAULT_PROJECT = "runs/train"  # YOLOv5 moves an evolution to runs/evolve when the project was left at this


@dataclasses.dataclass(frozen=True)
class EvolveSettings:
    """An evolution's settled inputs: where it lives, what it searches, how it prunes.

    Attributes:
        generations: N, the study's trials.
        evolve_dir: ``project/name`` (``runs/evolve/exp``), shared by every worker of the study.
        storage_url: the study store.
        study_name: the study's name in the store (``--name``).
        hyp: the starting hyperparameters (``--hyp``, else the data yaml's, else hyp.scratch-low.yaml).
        space: the evolved hyperparameters with their gains and limits.
        data: what identifies the dataset (its yaml's name, train and val entries and class names).
        epochs: epochs per trial.
        prune, sampler, heartbeat, seed: the options.
        grace: seconds a trial's heartbeat may be silent before another worker fails it and queues a retry
            (:func:`~ddp_utils.evolve.store.grace_period`: past the stall watchdog's timeout and a restart).
    """

    generations: int
    evolve_dir: Path
    storage_url: str
    study_name: str
    hyp: dict[str, Any]
    space: dict[str, Bound]
    data: dict[str, Any]
    epochs: int
    prune: str = "median"
    sampler: str = "yolov5"
    heartbeat: float = 60.0
    seed: int = 0
    grace: int = 300

    @classmethod
    def from_options(cls, opt: argparse.Namespace) -> EvolveSettings:
        """Settle the options; reads the data and hyp yamls, writes nothing.

        Raises:
            ValueError: (one line) a hyperparameter name the hyp lacks, a heartbeat that is no number of seconds
                up to a day, a data or hyp yaml that is missing or wrong, a storage URL that is no database URL.
        """
        if opt.evolve_heartbeat is None or not 0 < opt.evolve_heartbeat <= MAX_HEARTBEAT:  # nan, inf: refused
            raise ValueError(f"--evolve-heartbeat {opt.evolve_heartbeat}: give seconds > 0 and at most "
                             f"{MAX_HEARTBEAT:.0f} (a day), e.g. 60")  # fmt: skip
        data_file = find_yaml("data", opt.data)
        data = read_yaml(data_file)
        defaults = data.get("train_defaults") or {}
        hyp_source = opt.hyp or defaults.get("hyp", "hyp.scratch-low.yaml")
        hyp = load_hyp(hyp_source) if isinstance(hyp_source, str) else dict(hyp_source)
        space = search_space(hyp, opt.evolve_hyps)
        if not space:
            raise ValueError(f"--evolve: the hyp ({hyp_source}) has none of the hyperparameters to evolve; name "
                             "them with --evolve-hyps NAME[=LOW:HIGH]")  # fmt: skip
        project = "runs/evolve" if str(opt.project) == DEFAULT_PROJECT else opt.project
        evolve_dir = Path(project) / opt.name
        url = opt.evolve_storage or default_storage_url(evolve_dir)
        if opt.evolve_storage:
            from .store import check_storage_url

            check_storage_url(url)
        identity = {"yaml": data_file.name, **{k: data.get(k) for k in ("train", "val", "names")}}
        return cls(
            generations=int(opt.evolve),
            evolve_dir=evolve_dir,
            storage_url=url,
            study_name=str(opt.name),
            hyp=hyp,
            space=space,
            data=identity,
            epochs=int(chosen(opt.epochs, defaults.get("epochs", 100))),
            prune=opt.evolve_prune,
            sampler=opt.evolve_sampler,
            heartbeat=float(opt.evolve_heartbeat),
            seed=int(opt.seed),
            grace=grace_period(opt.evolve_heartbeat, stall_timeout_from_env()),
        )

    def identity(self) -> dict[str, Any]:
        """What the study records of itself, to refuse a worker started for another study under the same name."""
        return {"data": self.data, "space": space_record(self.space), "generations": self.generations, "hyp": self.hyp}

    def first_values(self) -> dict[str, float]:
        """The first trial: the starting hyperparameters, within the limits (YOLOv5's first generation)."""
        return constrain(self.hyp, self.space)

    def make_sampler(self) -> optuna.samplers.BaseSampler:
        """YOLOv5's mutation (:class:`~ddp_utils.evolve.mutation.YOLOv5Sampler`) or Optuna's TPE."""
        if self.sampler == "tpe":
            return optuna.samplers.TPESampler(seed=self.seed, n_startup_trials=5)
        return YOLOv5Sampler(self.space, self.hyp, seed=self.seed)

    def make_pruner(self) -> optuna.pruners.BasePruner:
        """The pruner: steps are epochs trained (a trial is judged from its first epoch after its warm-up, by
        :class:`~ddp_utils.evolve.trial.TrialStopper`).

        ``median``: below the median of the finished trials at the same epoch (two trials at least);
        ``halving``: successive halving (rungs after 1, 3, 9... epochs, the best third goes on); ``off``: none.
        """
        if self.prune == "median":
            return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0, n_min_trials=2)
        if self.prune == "halving":
            return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
        return optuna.pruners.NopPruner()


__all__ = ["EvolveSettings"]
