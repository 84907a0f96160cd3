"""What a run writes as it goes: its options (``yaml_save``), results.csv and TensorBoard events.

Everything here writes on the main process only. :class:`ResultsLogger` can be built on
every rank: elsewhere it is disabled and its methods do nothing. The run's directory, and its
numbered name, are :mod:`ddp_utils.run.start`'s and :mod:`ddp_utils.run.run_dir`'s.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ..files import mkstemp_shared
from ..log import LOGGER
from .checkpoint import to_plain
from .optional_files import OptionalFiles

METRIC_COLUMNS = (  # a validation's seven numbers, as results.csv and YOLOv5's evolve.csv name them
    "metrics/precision",
    "metrics/recall",
    "metrics/mAP_0.5",
    "metrics/mAP_0.5:0.95",
    "val/box_loss",
    "val/obj_loss",
    "val/cls_loss",
)
RESULTS_COLUMNS = (
    "epoch",
    "train/box_loss",
    "train/obj_loss",
    "train/cls_loss",
    *METRIC_COLUMNS,
    "x/lr0",
    "x/lr1",
    "x/lr2",
    "train/skipped_steps",  # after YOLOv5's columns, so tools that read those by position still do
)


def yaml_save(file: str | Path = "data.yaml", data: Mapping[str, Any] | Any = None) -> Path:
    """Write ``data`` (a dict or argparse Namespace) as YAML of plain values (Paths become str).

    The arguments are YOLOv5's (``yaml_save(file, data)``); returns the file's path.

    Examples:
        >>> import tempfile
        >>> p = yaml_save(Path(tempfile.mkdtemp()) / "opt.yaml", {"save_dir": Path("runs/exp"), "epochs": 3})
        >>> p.read_text()
        'save_dir: runs/exp\\nepochs: 3\\n'
    """
    path = Path(file)
    data = {} if data is None else data
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(to_plain(data), f, sort_keys=False, allow_unicode=True)
    return path


def results_values(
    train_loss: Sequence[float],
    metrics: Mapping[str, float],
    val_loss: Sequence[float],
    lrs: Sequence[float],
    skipped: int = 0,
) -> dict[str, float]:
    """Name one epoch's numbers with results.csv's columns (all but "epoch").

    Args:
        train_loss: mean training (box, obj, cls) loss (a tensor[3] works).
        metrics: ``evaluate``'s dict with "precision", "recall", "map50", "map".
        val_loss: validation (box, obj, cls) loss.
        lrs: the learning rate of each parameter group (``[g["lr"] for g in optimizer.param_groups]``).
        skipped: the epoch's optimizer steps skipped because their gradients were not finite.

    Examples:
        >>> v = results_values([1, 2, 3], {"precision": 0.5, "recall": 0.4, "map50": 0.3, "map": 0.2}, [4, 5, 6],
        ...                    [0.01, 0.01, 0.01])
        >>> v["metrics/mAP_0.5"], v["val/cls_loss"], v["x/lr2"]
        (0.3, 6.0, 0.01)
    """
    numbers = [
        *(float(x) for x in train_loss),
        *(float(metrics[k]) for k in ("precision", "recall", "map50", "map")),
        *(float(x) for x in val_loss),
        *(float(x) for x in lrs),
        float(skipped),
    ]
    if len(numbers) != len(RESULTS_COLUMNS) - 1:
        raise ValueError(
            f"results_values: got {len(numbers)} numbers for {len(RESULTS_COLUMNS) - 1} columns "
            "(expected 3 train losses, 4 metrics, 3 val losses, 3 learning rates and the skipped steps)"
        )
    return dict(zip(RESULTS_COLUMNS[1:], numbers))


def tensorboard_writer(log_dir: str | Path) -> Any | None:
    """A ``SummaryWriter`` writing to ``log_dir``, or None (and one info line) when tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        LOGGER.info("TensorBoard: not installed, so no event files (pip install tensorboard to get them)")
        return None
    LOGGER.info(f"TensorBoard: tensorboard --logdir {Path(log_dir).parent}, view at http://localhost:6006/")
    return SummaryWriter(str(log_dir))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _format(value: float) -> str:
    return f"{value:.6g}"


class ResultsLogger:
    """Append one row per epoch to ``save_dir/results.csv`` (and TensorBoard when installed).

    On resume, pass the first epoch to run: rows from that epoch on (written before the
    run stopped, and about to be redone) are dropped, earlier rows and the header kept.

    It writes wherever it is enabled: the caller decides who writes (train.py passes
    ``enabled=False`` off rank 0, where every method returns at once).

    Its writes are optional (:class:`~ddp_utils.run.optional_files.OptionalFiles`): a row that cannot be written
    (a full disk) is one warning, the first time, and is written with the next row that can be (nothing of it is left
    half-written meanwhile), so results.csv still has every epoch once when the disk frees up; TensorBoard, whose
    writer keeps its first error, stops there.

    Args:
        save_dir: the run directory.
        start_epoch: the epoch the run starts (or resumes) at.
        tensorboard: also write TensorBoard scalars when the package is importable.
        trackers: a :class:`~ddp_utils.run.trackers.Trackers` that gets every row too, or None.
        enabled: False: write nothing (the other ranks of a DDP run).
        optional: the run's optional writes (one warning for all of them); default: this logger's own.

    Examples:
        >>> import tempfile
        >>> run = Path(tempfile.mkdtemp())
        >>> logger = ResultsLogger(run, tensorboard=False)
        >>> logger.log(0, dict.fromkeys(RESULTS_COLUMNS[1:], 0.5))
        >>> (run / "results.csv").read_text().splitlines()[1].split(",")[:3]
        ['0', '0.5', '0.5']
    """

    def __init__(
        self,
        save_dir: str | Path,
        start_epoch: int = 0,
        tensorboard: bool = True,
        trackers: Any = None,
        enabled: bool = True,
        optional: OptionalFiles | None = None,
    ) -> None:
        self.save_dir = Path(save_dir)
        self.csv = self.save_dir / "results.csv"
        self.enabled = enabled
        self.tb = None
        self.trackers = trackers
        self.optional = optional or OptionalFiles()
        self._rows: list[list[str]] = []  # rows not yet on disk (a full disk): written with the next one
        if not self.enabled:
            return
        self.save_dir.mkdir(parents=True, exist_ok=True)
        self._truncate(start_epoch)
        if tensorboard:
            self.tb = self.optional.write(self.save_dir, lambda: tensorboard_writer(self.save_dir), " (TensorBoard)")

    def _truncate(self, start_epoch: int) -> None:
        if not self.csv.exists():
            return
        with open(self.csv, newline="", encoding="utf-8") as f:
            rows = [[cell.strip() for cell in row] for row in csv.reader(f) if row]
        if not rows:
            return
        if tuple(rows[0]) == RESULTS_COLUMNS[:-1]:  # written before the skipped steps were counted: none were
            rows = [list(RESULTS_COLUMNS), *(row + ["0"] for row in rows[1:] if len(row) == len(rows[0]))]
            self._rewrite(rows)
        if tuple(rows[0]) != RESULTS_COLUMNS:
            raise ValueError(
                f"{self.csv} has columns {rows[0]}, not results.csv's {list(RESULTS_COLUMNS)}: "
                "move it away or pick another run directory"
            )
        # a run killed mid-append can leave a short last row: drop it with the epochs to redo
        complete = [row for row in rows[1:] if len(row) == len(RESULTS_COLUMNS) and _is_number(row[0])]
        if len(complete) < len(rows) - 1:
            LOGGER.warning(f"{self.csv}: dropped {len(rows) - 1 - len(complete)} incomplete row(s)")
        kept = [row for row in complete if int(float(row[0])) < start_epoch]
        if len(kept) == len(rows) - 1:
            return
        self._rewrite([rows[0], *kept])
        LOGGER.info(f"{self.csv}: kept {len(kept)} epochs before {start_epoch}, dropped {len(rows) - 1 - len(kept)}")

    def _rewrite(self, rows: list[list[str]]) -> None:
        """Replace results.csv by ``rows`` atomically."""
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows(rows)
        fd, tmp = mkstemp_shared(self.save_dir, prefix=".results.", suffix=".csv.tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(buffer.getvalue())
        os.replace(tmp, self.csv)

    def log(self, epoch: int, values: Mapping[str, float]) -> None:
        """Write epoch ``epoch``'s row; ``values`` has every column but "epoch" (see :func:`results_values`).

        Keys beyond the columns go to TensorBoard only.
        """
        if not self.enabled:
            return
        missing = [k for k in RESULTS_COLUMNS[1:] if k not in values]
        if missing:
            raise KeyError(f"ResultsLogger.log: values lack the columns {missing}")
        self._rows.append([str(int(epoch)), *(_format(float(values[k])) for k in RESULTS_COLUMNS[1:])])
        self.optional.write(self.csv, self._append_rows)
        if self.tb is not None and self.optional.write(self.save_dir, lambda: self._tensorboard(epoch, values),
                                                       " (TensorBoard)") is None:  # fmt: skip
            self.tb = None  # its writer keeps its first error: it would raise again at every call
        if self.trackers is not None:
            self.trackers.log(epoch, values)

    def _append_rows(self) -> None:
        """Append the rows not yet on disk (the header first into a new file); one that fails is cut off again."""
        size = self.csv.stat().st_size if self.csv.exists() else 0
        try:
            with open(self.csv, "a", newline="", encoding="utf-8") as f:
                writer = csv.writer(f, lineterminator="\n")
                if size == 0:
                    writer.writerow(RESULTS_COLUMNS)
                writer.writerows(self._rows)
        except OSError:
            with contextlib.suppress(OSError):  # no half row left behind: the next append starts on a line
                os.truncate(self.csv, size)
            raise
        self._rows.clear()

    def _tensorboard(self, epoch: int, values: Mapping[str, float]) -> bool:
        for key, value in values.items():
            self.tb.add_scalar(key, float(value), epoch)
        self.tb.flush()
        return True

    def log_weights(self, paths: Sequence[str | Path]) -> None:
        """Hand the run's checkpoints to the trackers (as artifacts); results.csv and TensorBoard keep none."""
        if self.enabled and self.trackers is not None:
            self.trackers.log_weights([Path(p) for p in paths])

    def close(self, finished: bool = True, failed: bool = False) -> None:
        """Close the TensorBoard writer and end the trackers' runs (``finished``: not stopped to resume); rows a full
        disk held back are tried a last time."""
        if self._rows:
            self.optional.write(self.csv, self._append_rows)
        if self.tb is not None:
            tb, self.tb = self.tb, None
            self.optional.write(self.save_dir, tb.close, " (TensorBoard)")
        if self.trackers is not None:
            self.trackers.close(finished, failed)
            self.trackers = None

    def __enter__(self) -> ResultsLogger:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        """An error or a second Ctrl-C leaving the block ends the trackers' runs as failed, not left running."""
        if kind is not None:
            self.close(finished=False, failed=not issubclass(kind, KeyboardInterrupt))
