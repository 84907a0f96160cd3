"""Where a run stands: :class:`TrainState`, the part of a checkpoint that lets a resume continue at the next batch.

With it, everything the next step depends on is in ``last.pt`` or follows from (seed, epoch, step,
index): the data order, every augmentation, the multi-scale size, the warm-up and the LR schedule.
Batches are counted globally (global batch ``k`` is the same images whatever the number of
processes), so a run resumes with another number of processes. :mod:`ddp_utils.run.resume` finds
and checks what to resume and puts it back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from .checkpoint import to_plain

_EMPTY_VAL = {"precision": 0.0, "recall": 0.0, "map50": 0.0, "map": 0.0}
_TOP_LEVEL = ("epoch", "best_fitness")  # TrainState's fields that the checkpoint keeps at its top level only


@dataclasses.dataclass
class TrainState:
    """Where a run stands: the part of a checkpoint that lets a resume continue at the next global batch.

    Attributes:
        epoch: the epoch in progress (the next one to train when ``batch`` is 0).
        batch: global batches of ``epoch`` already trained; ``batches`` when the epoch is trained but
            not yet validated (a stop at its end).
        batches: batches per epoch (the same for any number of processes at the same total batch).
        batch_size: the total batch size over all processes.
        world_size: the processes that saved it.
        last_opt_step: the global iteration of the last optimizer step: the accumulation phase.
        loss: per rank, the running mean (box, obj, cls) loss over the epoch's trained batches.
        best_fitness: the best fitness so far.
        best_epoch: the epoch that reached it (early stopping counts from there).
        last_val: the last validation: ``metrics`` (precision, recall, map50, map), ``val_loss``
            (box, obj, cls) and ``maps`` (per-class mAP@0.5:0.95, what ``--image-weights`` draws by).
        skipped: optimizer steps skipped so far in the run because their gradients were not finite.

    The checkpoint keeps :attr:`epoch` and :attr:`best_fitness` once, at its top level (``epoch`` there is the
    last epoch done: ``self.epoch - 1``); :meth:`as_dict` leaves them out of ``train_state``.

    Examples:
        >>> state = TrainState(epoch=2, batch=5, batches=8, batch_size=16, world_size=2)
        >>> TrainState.from_checkpoint({"epoch": 1, "train_state": state.as_dict()}).where()
        'epoch 3, batch 5/8'
        >>> TrainState.from_checkpoint({"epoch": 4}).where()  # a checkpoint saved at an epoch's end
        'epoch 6'
    """

    epoch: int = 0
    batch: int = 0
    batches: int = 0
    batch_size: int = 0
    world_size: int = 1
    last_opt_step: int = -1
    loss: list[list[float]] = dataclasses.field(default_factory=list)
    best_fitness: float = 0.0
    best_epoch: int = -1
    last_val: dict[str, Any] = dataclasses.field(default_factory=dict)
    skipped: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Plain values for the checkpoint's ``train_state``: all but :attr:`epoch` and :attr:`best_fitness`,
        which the checkpoint holds once, as YOLOv5's does (``epoch``, the last epoch done, is ``self.epoch - 1``)."""
        return to_plain({k: v for k, v in dataclasses.asdict(self).items() if k not in _TOP_LEVEL})

    @classmethod
    def from_checkpoint(cls, ckpt: Mapping[str, Any]) -> TrainState:
        """The state a checkpoint records; one from before ``train_state`` existed starts the epoch after its own."""
        epoch = int(ckpt.get("epoch", -1))
        top = dict(epoch=epoch + 1, best_fitness=float(ckpt.get("best_fitness", 0.0) or 0.0))
        recorded = ckpt.get("train_state")
        if isinstance(recorded, Mapping):
            known = {f.name for f in dataclasses.fields(cls)} - set(_TOP_LEVEL)
            return cls(**{k: v for k, v in recorded.items() if k in known}, **top)
        return cls(**top, best_epoch=epoch)

    def where(self) -> str:
        """``"epoch 3, batch 12/24"`` (from 1, as the log counts epochs), or ``"epoch 3"`` at its start."""
        if self.batch == 0:
            return f"epoch {self.epoch + 1}"
        return f"epoch {self.epoch + 1}, batch {self.batch}/{self.batches}"

    def rank_loss(self, rank: int, world_size: int) -> torch.Tensor | None:
        """The running loss this rank continues from: its own at the same scale, else the mean of all ranks'.

        None when the epoch had not started.
        """
        if self.batch == 0 or not self.loss:
            return None
        losses = torch.tensor(self.loss, dtype=torch.float32)
        return losses[rank] if world_size == len(self.loss) else losses.mean(0)

    def epoch_done(
        self,
        last_opt_step: int,
        stopper: Any,
        metrics: Mapping[str, float],
        val_loss: torch.Tensor,
        maps: Any = None,
        skipped: int | None = None,
    ) -> TrainState:
        """The state once :attr:`epoch` is trained and validated: the next epoch, from its first batch.

        Args:
            last_opt_step: the step's ``last_opt_step`` (the accumulation phase carries over).
            stopper: the :class:`~ddp_utils.run.EarlyStopping` that just saw the epoch (its best fitness and epoch).
            metrics: the validation's precision, recall, map50, map.
            val_loss: its (box, obj, cls) loss.
            maps: per-class mAP@0.5:0.95 (``--image-weights`` draws the next epochs by it), or None.
            skipped: the optimizer steps skipped so far in the run (None: as it was).
        """
        best = self.best_fitness if stopper.best_fitness is None else max(self.best_fitness, stopper.best_fitness)
        last_val = {
            "metrics": {k: float(metrics[k]) for k in _EMPTY_VAL},
            "val_loss": [float(x) for x in val_loss],
            "maps": None if maps is None else [float(x) for x in maps],
        }
        return dataclasses.replace(
            self,
            epoch=self.epoch + 1,
            batch=0,
            last_opt_step=int(last_opt_step),
            loss=[],
            best_fitness=float(best),
            best_epoch=int(stopper.best_epoch),
            last_val=last_val,
            skipped=self.skipped if skipped is None else int(skipped),
        )

    def metrics(self) -> tuple[dict[str, float], torch.Tensor]:
        """The last validation's ``(metrics, val_loss)`` (zeros before the first)."""
        val = self.last_val or {}
        return {**_EMPTY_VAL, **val.get("metrics", {})}, torch.tensor(val.get("val_loss", [0.0] * 3))


__all__ = ["TrainState"]
