"""The search space: YOLOv5's table, the names a user picks, the limits every value is held to."""

from __future__ import annotations

import pytest

from ddp_utils.evolve.space import YOLOV5_SPACE, Bound, SearchSpaceError, constrain, search_space
from ddp_utils.hyp import load_hyp


def test_the_default_space_is_yolov5s_moving_entries_that_the_hyp_has():
    hyp = load_hyp("hyp.shapes.yaml")
    space = search_space(hyp)
    assert list(space) == [k for k in hyp if k in space]  # the hyp's order
    assert "lr0" in space and space["momentum"] == Bound(0.3, 0.6, 0.98)
    # gain 0 in YOLOv5's table: never mutated, so not searched; "anchors" is no hyperparameter of ours
    assert not {"iou_t", "fl_gamma", "perspective", "fliplr", "anchors"} & set(space)
    assert {"nbs", "warmup_min_iters"}.isdisjoint(space)  # ours, not YOLOv5's: kept as the hyp says
    assert set(space) == {k for k, (gain, _, _) in YOLOV5_SPACE.items() if gain > 0 and k in hyp}


def test_named_hyperparameters_take_yolov5s_limits_or_a_range_given():
    hyp = load_hyp("hyp.scratch-low.yaml")
    space = search_space(hyp, ["mosaic=0:0.5", "lr0", "iou_t"])
    assert list(space) == ["lr0", "iou_t", "mosaic"]  # the hyp's order, not the command line's
    assert space["mosaic"] == Bound(1.0, 0.0, 0.5) and space["lr0"] == Bound(1.0, 1e-5, 0.1)
    assert space["iou_t"].gain == 1.0  # asked for by name: it moves, although YOLOv5 keeps it fixed


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["lr9"], r"^--evolve-hyps lr9: not a hyperparameter of the run's hyp \(it has lr0, lrf"),
        (["nbs"], r"^--evolve-hyps nbs: YOLOv5 gives it no range; give one as nbs=LOW:HIGH"),
        (["mosaic=1:0"], r"^--evolve-hyps mosaic=1:0: the low end 1.0 is above the high end 0.0"),
        (["mosaic=a:b"], r"^--evolve-hyps mosaic=a:b: give a range as NAME=LOW:HIGH"),
    ],
)
def test_a_name_or_range_that_cannot_be_searched_is_one_line(names, message):
    with pytest.raises(SearchSpaceError, match=message):
        search_space(load_hyp("hyp.shapes.yaml"), names)


@pytest.mark.parametrize(
    ("extra", "names", "message"),
    [
        (
            {"anchors": 3},
            None,
            r"^--evolve: the hyp has anchors: 3; the anchors per output .* ddp_utils has no "
            r"AutoAnchor, its models take their anchors from the model yaml \(--cfg\); remove anchors from the hyp",
        ),
        ({"anchors": 3}, ["lr0", "anchors"], r"^--evolve-hyps anchors: the anchors per output"),
        ({"anchors": 3}, ["anchors=2:10"], r"^--evolve-hyps anchors=2:10: the anchors per output"),
    ],
)
def test_anchors_which_yolov5_evolves_are_refused_by_name(extra, names, message):
    """YOLOv5 evolves ``anchors`` (2-10 per output) when its hyp has the key, building the model with that many and
    computing them with AutoAnchor; ddp_utils has no AutoAnchor (its Model takes a count only as placeholders to
    be computed), so the key was evolved and then never used. Now: one line saying so."""
    hyp = load_hyp("hyp.scratch-low.yaml") | extra
    with pytest.raises(SearchSpaceError, match=message):
        search_space(hyp, names)
    assert "anchors" not in search_space(hyp, ["lr0"])  # evolving other names: the key stays as the hyp says


def test_values_are_clipped_to_the_limits_and_rounded_to_five_decimals():
    space = {"lr0": Bound(1, 1e-5, 0.1), "momentum": Bound(0.3, 0.6, 0.98), "mixup": Bound(1, 0.0, 1.0)}
    assert constrain({"lr0": 3.0, "momentum": 0.1, "mixup": 0.123456789, "extra": 5}, space) == {
        "lr0": 0.1,
        "momentum": 0.6,
        "mixup": 0.12346,
    }
