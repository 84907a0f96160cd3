"""Starting a run: the settled options (:class:`Run`: the options and their checks are
:mod:`ddp_utils.run.options`), its directory, its records of what it uses (``hyp.yaml``, ``opt.yaml``).

A run directory (``runs/train/exp3``) is written only by the run that owns it: a new run claims a
fresh one (:func:`make_run_dir`); a resumed run writes into the directory of the ``last.pt`` it
continues, and only after every reason to refuse the resume has been checked
(:func:`~ddp_utils.run.resume.find_resume`).
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
from pathlib import Path
from typing import Any

from ..data.config import check_dataset
from ..distributed import DistInfo, broadcast_object, launch_key
from ..engine.amp import train_mode
from ..hyp import load_hyp
from ..log import LOGGER
from .loggers import yaml_save
from .option_checks import chosen
from .resume import Resume
from .run_dir import increment_path


@dataclasses.dataclass(frozen=True)
class Run:
    """A run's settled options: the command line (or the resumed run's) with every default filled in.

    ``opt`` stays as parsed; what the data yaml, the model or AutoBatch decided lives in the
    fields, and :meth:`options` is what ``opt.yaml`` and every checkpoint record.
    """

    opt: argparse.Namespace
    save_dir: Path | None
    run_key: str
    data: dict[str, Any]
    hyp: dict[str, Any]
    hyp_source: str | dict[str, Any]
    epochs: int
    amp: str
    nc: int
    names: dict[int, str]
    imgsz: int | None = None
    batch_size: int | None = None
    resume: Resume | None = None
    channels_last: bool = False

    def options(self) -> dict[str, Any]:
        """The options as this run uses them (``opt.yaml``; a resume reads them back)."""
        settled = dict(epochs=self.epochs, hyp=self.hyp_source, amp=self.amp, imgsz=self.imgsz)
        settled["channels_last"] = self.channels_last  # with amp, how it computes: a resume continues alike
        where = dict(batch_size=self.batch_size, run_key=self.run_key, save_dir=str(self.save_dir))
        return {**vars(self.opt), **settled, **where}

    def replace(self, **changes: Any) -> Run:
        """A copy with ``changes`` (the run object is frozen)."""
        return dataclasses.replace(self, **changes)


def start_run(opt: argparse.Namespace, info: DistInfo, device: Any, resume: Resume | None) -> Run:
    """Settle the data and hyperparameters: the data yaml (the node's first process downloads or
    generates the data), its ``train_defaults`` for what the command line left open, mixed precision
    and memory layout (:func:`~ddp_utils.engine.amp.train_mode`: the CPU's by its flags; the log says why).

    Raises:
        FileNotFoundError, ValueError: a data or hyperparameter yaml that is missing or wrong (one line).
    """
    data = check_dataset(opt.data)
    defaults = data.get("train_defaults", {})
    hyp_source = opt.hyp or defaults.get("hyp", "hyp.scratch-low.yaml")
    hyp = load_hyp(hyp_source) if isinstance(hyp_source, str) else dict(hyp_source)  # what the run uses, unchanged
    nc = 1 if opt.single_cls else int(data["nc"])
    names = {0: "item"} if opt.single_cls and len(data["names"]) != 1 else data["names"]
    mode = train_mode(opt.amp, device, channels_last=getattr(opt, "channels_last", None))  # recorded: a resume's
    LOGGER.info(f"compute: {mode.why}")
    return Run(
        opt=opt,
        save_dir=resume.save_dir if resume else None,
        run_key=launch_key(info),
        data=data,
        hyp=hyp,
        hyp_source=hyp_source,
        epochs=chosen(opt.epochs, defaults.get("epochs", 100)),  # --epochs given, else the data yaml's
        amp=mode.amp,
        nc=nc,
        names=names,
        imgsz=chosen(opt.imgsz, defaults.get("imgsz", 640)),
        batch_size=opt.batch_size,
        resume=resume,
        channels_last=mode.channels_last,
    )


def make_run_dir(project: str | Path, name: str, exist_ok: bool, info: DistInfo) -> Path:
    """Rank 0 claims ``project/name`` (or ``name2``, ``name3``, ... when taken); every rank gets the path."""
    new_dir = increment_path(Path(project) / name, exist_ok=exist_ok, mkdir=True) if info.is_main else None
    return Path(broadcast_object(str(new_dir) if new_dir is not None else None))


def record_run(run: Run, info: DistInfo) -> str | None:
    """Rank 0 writes the run's ``hyp.yaml`` and ``opt.yaml`` and logs the hyperparameters; every rank calls it.

    These are no optional files: an elastic restart finds its run by the launch key ``opt.yaml`` records.

    Returns:
        None; or, the same on every rank, why rank 0 could not write them (a full disk): nothing was trained, and the
        run ends there (train.py: that line, exit code 74).
    """
    failed = None
    if info.is_main:
        path = run.save_dir / "hyp.yaml"
        try:
            yaml_save(path, run.hyp)
            path = run.save_dir / "opt.yaml"
            yaml_save(path, run.options())
        except OSError as exc:
            failed = (f"could not write {path}: {exc.strerror or exc}; nothing was trained, and nothing is on disk "
                      "to resume from: free the disk, then start the run again")  # fmt: skip
        else:
            pairs = ", ".join(f"{k}={v}" for k, v in run.hyp.items())
            LOGGER.info(textwrap.fill(pairs, width=110, initial_indent="hyperparameters: ", subsequent_indent="  "))
    return broadcast_object(failed)


__all__ = ["Run", "make_run_dir", "record_run", "start_run"]
