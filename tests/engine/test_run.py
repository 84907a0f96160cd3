"""train.py's options checked before anything starts: combinations and every numeric option's range."""

from __future__ import annotations

import pytest

from ddp_utils.engine.run import check_options
from train import parse_opt


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--imgsz", "-5"], "--imgsz -5: give the image size in pixels"),
        (["--imgsz", "0"], "--imgsz 0: give the image size in pixels"),
        (["--workers", "-1"], "--workers -1: give a number of loader workers >= 0"),
        (["--patience", "-3"], "--patience -3: give epochs without improvement >= 0"),
        (["--save-period", "-2"], "--save-period -2: give a number of epochs >= 1, or -1 (never)"),
        (["--save-interval", "-1"], "--save-interval -1.0: give minutes >= 0"),
        (["--save-interval", "nan"], "--save-interval nan: give minutes >= 0"),
        (["--label-smoothing", "1"], "--label-smoothing 1.0: give a value in [0, 1)"),
        (["--freeze", "10", "-1"], "--freeze 10 -1: give layer counts or indices >= 0"),
        (["--seed", "-7"], "--seed -7: give a seed >= 0"),
        (["--epochs", "0"], "--epochs 0: train at least one epoch"),
        (["--batch-size", "0"], "--batch-size 0: give the total batch size"),
    ],
)
def test_a_value_out_of_range_is_one_line_naming_the_option_and_the_value(args, message):
    with pytest.raises(ValueError) as info:
        check_options(parse_opt(args), world_size=1)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "args",
    [[], ["--imgsz", "320", "--workers", "0", "--patience", "0", "--save-period", "-1", "--save-interval", "0"],
     ["--save-period", "5", "--label-smoothing", "0.1", "--freeze", "10", "--seed", "0"]],
)  # fmt: skip
def test_the_defaults_and_sensible_values_pass(args):
    check_options(parse_opt(args), world_size=1)
