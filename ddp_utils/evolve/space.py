"""The search space of ``train.py --evolve``: which hyperparameters move, how far, within which limits.

YOLOv5 (v7.0, ``train.py``) evolves the hyperparameters of its ``meta`` table, each with a mutation gain (0:
never moves, 1: full steps) and a lower and upper limit; every value it trains is clipped to those limits and
rounded to 5 significant decimals. :data:`YOLOV5_SPACE` holds the same numbers (facts, restated here), and
:func:`search_space` picks the entries a run's hyperparameters have, or the names a user asks for
(``--evolve-hyps lr0 momentum mosaic=0:0.5``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

# name: (mutation gain, lower limit, upper limit), YOLOv5 v7.0's values
YOLOV5_SPACE: dict[str, tuple[float, float, float]] = {
    "lr0": (1, 1e-5, 1e-1),
    "lrf": (1, 0.01, 1.0),
    "momentum": (0.3, 0.6, 0.98),
    "weight_decay": (1, 0.0, 0.001),
    "warmup_epochs": (1, 0.0, 5.0),
    "warmup_momentum": (1, 0.0, 0.95),
    "warmup_bias_lr": (1, 0.0, 0.2),
    "box": (1, 0.02, 0.2),
    "cls": (1, 0.2, 4.0),
    "cls_pw": (1, 0.5, 2.0),
    "obj": (1, 0.2, 4.0),
    "obj_pw": (1, 0.5, 2.0),
    "iou_t": (0, 0.1, 0.7),
    "anchor_t": (1, 2.0, 8.0),
    "anchors": (2, 2.0, 10.0),  # anchors per output: refused here (NO_ANCHORS), the models' come from their yaml
    "fl_gamma": (0, 0.0, 2.0),
    "hsv_h": (1, 0.0, 0.1),
    "hsv_s": (1, 0.0, 0.9),
    "hsv_v": (1, 0.0, 0.9),
    "degrees": (1, 0.0, 45.0),
    "translate": (1, 0.0, 0.9),
    "scale": (1, 0.0, 0.9),
    "shear": (1, 0.0, 10.0),
    "perspective": (0, 0.0, 0.001),
    "flipud": (1, 0.0, 1.0),
    "fliplr": (0, 0.0, 1.0),
    "mosaic": (1, 0.0, 1.0),
    "mixup": (1, 0.0, 1.0),
    "copy_paste": (1, 0.0, 1.0),
}
DIGITS = 5  # YOLOv5 rounds every evolved value to 5 decimals
# YOLOv5 builds its model with hyp["anchors"] anchors per output and lets AutoAnchor compute them (k-means and a
# genetic search over the labels); ddp_utils has no AutoAnchor, so a count alone would train on placeholder anchors
NO_ANCHORS = (
    "the anchors per output (YOLOv5 builds its model with that many and computes them with AutoAnchor) cannot be "
    "evolved here: ddp_utils has no AutoAnchor, its models take their anchors from the model yaml (--cfg); remove "
    "anchors from the hyp, or evolve another model yaml's anchors by hand"
)


@dataclasses.dataclass(frozen=True)
class Bound:
    """One evolved hyperparameter: its mutation gain and limits.

    Examples:
        >>> Bound(1.0, 0.0, 0.9).clip(1.3), Bound(1.0, 0.0, 0.9).clip(0.1234567)
        (0.9, 0.12346)
    """

    gain: float
    low: float
    high: float

    def clip(self, value: float) -> float:
        """``value`` within the limits, rounded as YOLOv5 rounds."""
        return round(min(max(float(value), self.low), self.high), DIGITS)


class SearchSpaceError(ValueError):
    """A search space that names a hyperparameter the run does not have, or a range that is no range."""


def search_space(hyp: Mapping[str, Any], names: Iterable[str] | None = None) -> dict[str, Bound]:
    """The hyperparameters to evolve, in ``hyp``'s order, with their gains and limits.

    Args:
        hyp: the run's hyperparameters (the ``--hyp`` yaml).
        names: ``--evolve-hyps``: names of YOLOv5's table (``lr0``; one it keeps fixed gets gain 1) or
            ``name=low:high`` for a range of one's own (gain 1); None: every entry of :data:`YOLOV5_SPACE` that
            ``hyp`` has and YOLOv5 moves (gain > 0).

    Raises:
        SearchSpaceError: a name ``hyp`` lacks, a name without a range (not YOLOv5's and none given), a range
            whose low end is above its high end, or ``anchors`` (in the hyp, or named: :data:`NO_ANCHORS`); the
            message names it.

    Examples:
        >>> list(search_space({"lr0": 0.01, "iou_t": 0.2, "nbs": 64, "mosaic": 1.0}))  # iou_t: gain 0
        ['lr0', 'mosaic']
        >>> search_space({"lr0": 0.01, "mosaic": 1.0}, ["mosaic=0:0.5"])
        {'mosaic': Bound(gain=1.0, low=0.0, high=0.5)}
        >>> search_space({"lr0": 0.01}, ["lr1"])
        Traceback (most recent call last):
        ddp_utils.evolve.space.SearchSpaceError: --evolve-hyps lr1: not a hyperparameter of the run's hyp (it has lr0)
    """
    if names is None:
        if "anchors" in hyp:  # YOLOv5 would evolve it: say why it cannot be, rather than evolve a value unused
            raise SearchSpaceError(f"--evolve: the hyp has anchors: {hyp['anchors']}; {NO_ANCHORS}")
        return {k: Bound(*map(float, YOLOV5_SPACE[k])) for k in hyp if k in YOLOV5_SPACE and YOLOV5_SPACE[k][0] > 0}
    wanted: dict[str, Bound] = {}
    for item in names:
        name, _, given = str(item).partition("=")
        if name == "anchors":
            raise SearchSpaceError(f"--evolve-hyps {item}: {NO_ANCHORS}")
        if name not in hyp:
            known = ", ".join(hyp)
            raise SearchSpaceError(f"--evolve-hyps {item}: not a hyperparameter of the run's hyp (it has {known})")
        wanted[name] = _parse_bound(item, given) if given else _yolov5_bound(item)
    return {k: wanted[k] for k in hyp if k in wanted}


def _yolov5_bound(name: str) -> Bound:
    if name not in YOLOV5_SPACE:
        raise SearchSpaceError(f"--evolve-hyps {name}: YOLOv5 gives it no range; give one as {name}=LOW:HIGH")
    gain, low, high = map(float, YOLOV5_SPACE[name])
    return Bound(gain or 1.0, low, high)  # asked for by name: it moves, even where YOLOv5 keeps it fixed (iou_t)


def _parse_bound(item: str, given: str) -> Bound:
    try:
        low, high = (float(x) for x in given.split(":"))
    except ValueError:
        raise SearchSpaceError(f"--evolve-hyps {item}: give a range as NAME=LOW:HIGH, e.g. lr0=0.001:0.05") from None
    if not low <= high:
        raise SearchSpaceError(f"--evolve-hyps {item}: the low end {low} is above the high end {high}")
    return Bound(1.0, low, high)


def space_record(space: Mapping[str, Bound]) -> dict[str, list[float]]:
    """The space as plain values (what a study records, to refuse another space later).

    Examples:
        >>> space_record({"lr0": Bound(1.0, 1e-5, 0.1)})
        {'lr0': [1.0, 1e-05, 0.1]}
    """
    return {k: [b.gain, b.low, b.high] for k, b in space.items()}


def constrain(values: Mapping[str, float], space: Mapping[str, Bound]) -> dict[str, float]:
    """``values`` of the evolved names, clipped to the space's limits and rounded as YOLOv5 does.

    Examples:
        >>> constrain({"lr0": 0.5, "mosaic": 0.25}, {"lr0": Bound(1, 1e-5, 0.1), "mosaic": Bound(1, 0, 1)})
        {'lr0': 0.1, 'mosaic': 0.25}
    """
    return {k: bound.clip(values[k]) for k, bound in space.items()}


__all__ = [
    "DIGITS",
    "NO_ANCHORS",
    "YOLOV5_SPACE",
    "Bound",
    "SearchSpaceError",
    "constrain",
    "search_space",
    "space_record",
]
