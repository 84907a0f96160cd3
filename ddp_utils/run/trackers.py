"""Experiment trackers detection users already log to, besides results.csv and TensorBoard: MLflow, Weights & Biases.

Off unless asked for (``train.py --trackers mlflow wandb``); the main process only. A tracker whose
package is missing, or that fails to start or later (a full disk, a server gone), is one warning line
and is dropped: training never fails for a tracker.

- **MLflow**: the tracking store is ``$MLFLOW_TRACKING_URI``, else a local sqlite store beside the
  runs (``<project>/mlflow.db``, artifacts in ``<project>/mlartifacts``; ``mlflow ui --backend-store-uri
  sqlite:///<project>/mlflow.db`` shows it, with the full ``mlflow`` package: the ``[mlflow]`` extra's
  ``mlflow-skinny`` logs and reads runs, but has no UI server). The experiment is the project directory, the run the run
  directory's name; the options and hyperparameters are its params, results.csv's columns its metrics
  (one step per epoch), ``best.pt`` and ``last.pt`` its artifacts. A resumed run continues the same
  MLflow run (found by its run directory).
- **Weights & Biases**: ``wandb.init`` with the run directory's name, the options and hyperparameters as
  config, results.csv's columns per epoch, the weights as a ``model`` artifact. ``$WANDB_MODE`` decides
  online or offline; without it a machine that is not logged in (no ``WANDB_API_KEY``, no api.wandb.ai
  in ``~/.netrc``) logs offline, never prompting (``wandb sync <run>/wandb/offline-run-*`` uploads it).
  A resumed run continues the same W&B run (its id follows from the run directory).

A process that ends without :meth:`Trackers.close` (an error anywhere, a finish step that raised) ends
the runs still open as failed (MLflow FAILED, W&B exit code 1) at exit, instead of leaving them RUNNING.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..log import LOGGER

TRACKERS = ("mlflow", "wandb")


def _flat(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested options as ``{"hyp/lr0": "0.01", ...}``: what both trackers take as params (strings, 500 chars)."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{name}/"))
        else:
            flat[name] = str(value)[:500]
    return flat


def _metric_name(name: str) -> str:
    """A results.csv column as MLflow accepts it (letters, digits, ``_-. /:``)."""
    return re.sub(r"[^\w\-. /:]", "_", name)


class _MLflow:
    name = "mlflow"

    def __init__(self, save_dir: Path, project: Path, params: Mapping[str, Any]) -> None:
        import mlflow  # an optional extra: pip install "ddp_utils[mlflow]"

        project.mkdir(parents=True, exist_ok=True)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project.resolve() / 'mlflow.db'}"
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(str(project))
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(
                str(project), artifact_location=(project / "mlartifacts").resolve().as_uri()
            )
        )
        where = str(save_dir.resolve())
        found = self.client.search_runs([experiment_id], filter_string=f"tags.save_dir = '{where}'", max_results=1)
        if found:  # a resumed run goes on in the same MLflow run
            self.run_id = found[0].info.run_id
        else:
            run = self.client.create_run(experiment_id, run_name=save_dir.name, tags={"save_dir": where})
            self.run_id = run.info.run_id
            for key, value in _flat(params).items():
                self.client.log_param(self.run_id, key, value)
        self.uri = uri

    def log(self, epoch: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self.client.log_metric(self.run_id, _metric_name(key), float(value), step=int(epoch))

    def log_weights(self, paths: Sequence[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path), artifact_path="weights")

    def close(self, finished: bool, failed: bool) -> None:
        status = "FAILED" if failed else "FINISHED" if finished else "KILLED"
        self.client.set_terminated(self.run_id, status=status)


def _wandb_logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


class _Wandb:
    name = "wandb"

    def __init__(self, save_dir: Path, project: Path, params: Mapping[str, Any]) -> None:
        import wandb  # an optional extra: pip install "ddp_utils[wandb]"

        mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_logged_in() else "offline")
        run_id = hashlib.sha1(str(save_dir.resolve()).encode()).hexdigest()[:16]  # the same run after a resume
        self.run = wandb.init(
            project=re.sub(r"[^\w\-.]", "-", str(project)).strip("-") or "ddp_utils",
            name=save_dir.name,
            id=run_id,
            resume="allow",
            dir=str(save_dir),
            config=dict(params),
            mode=mode,
            entity=dict(params).get("opt", {}).get("entity"),  # YOLOv5's --entity: the team or user
        )
        self.wandb, self.mode = wandb, mode

    def log(self, epoch: int, values: Mapping[str, float]) -> None:
        self.run.log({**{k: float(v) for k, v in values.items()}, "epoch": int(epoch)}, step=int(epoch))

    def log_weights(self, paths: Sequence[Path]) -> None:
        artifact = self.wandb.Artifact(f"run_{self.run.id}_model", type="model")
        for path in paths:
            artifact.add_file(str(path), name=path.name)
        self.run.log_artifact(artifact)

    def close(self, finished: bool, failed: bool) -> None:
        self.run.finish(exit_code=0 if finished and not failed else 1)


_KINDS = {"mlflow": _MLflow, "wandb": _Wandb}


class Trackers:
    """The trackers asked for, each dropped (with one warning) the first time it fails.

    Args:
        names: any of :data:`TRACKERS`.
        save_dir: the run directory.
        project: the directory of runs (MLflow's experiment, W&B's project).
        params: the run's options and hyperparameters (``{"opt": {...}, "hyp": {...}}``).

    Examples:
        >>> Trackers([], Path("runs/train/exp"), Path("runs/train"), {}).active
        []
    """

    def __init__(self, names: Iterable[str], save_dir: Path, project: Path, params: Mapping[str, Any]) -> None:
        self.active: list[Any] = []
        for name in dict.fromkeys(names):
            if name not in _KINDS:
                raise ValueError(f"tracker {name!r}: choose from {', '.join(TRACKERS)}")
            try:
                tracker = _KINDS[name](Path(save_dir), Path(project), params)
            except ImportError:
                LOGGER.warning(f"{name}: not installed, so not tracking this run (pip install 'ddp_utils[{name}]')")
                continue
            except Exception as exc:  # a tracker never fails the run
                LOGGER.warning(f"{name}: could not start ({type(exc).__name__}: {exc}); not tracking this run")
                continue
            self.active.append(tracker)
            where = getattr(tracker, "uri", None) or f"mode {getattr(tracker, 'mode', '')}"
            LOGGER.info(f"{name}: tracking this run ({where})")
        if self.active:
            atexit.register(self._close_at_exit)

    def _each(self, method: str, *args: Any) -> None:
        for tracker in list(self.active):
            try:
                getattr(tracker, method)(*args)
            except Exception as exc:
                LOGGER.warning(f"{tracker.name}: {method} failed ({type(exc).__name__}: {exc}); no longer tracking")
                self.active.remove(tracker)

    def log(self, epoch: int, values: Mapping[str, float]) -> None:
        """One epoch's numbers (results.csv's columns)."""
        self._each("log", epoch, values)

    def log_weights(self, paths: Sequence[Path]) -> None:
        """The run's checkpoints, as artifacts (the ones that exist)."""
        existing = [Path(p) for p in paths if Path(p).is_file()]
        if existing:
            self._each("log_weights", existing)

    def close(self, finished: bool = True, failed: bool = False) -> None:
        """End the trackers' runs: finished, stopped to be resumed, or failed (MLflow: FINISHED, KILLED, FAILED)."""
        self._each("close", finished, failed)
        self.active = []
        atexit.unregister(self._close_at_exit)

    def _close_at_exit(self) -> None:
        # the process is ending and nobody closed the runs: it did not finish
        self.close(finished=False, failed=True)


__all__ = ["TRACKERS", "Trackers"]
