"""train.py in float64, for tests that must tell a difference in the math from float32 rounding.

``python -m tests.workers.float64_train <train.py's arguments>`` (or the same under ``torchrun -m``) runs
train.py unchanged but for two things: the model is built in float64 and the step's float images are
float64 (the EMA stays float32 by design, and so does validation, which reads it). A tiny yolov5n run
from scratch amplifies float32 rounding step after step (thread counts alone move its weights by 1e-4
in half an epoch); in float64 that rounding is some 1e-16, so two runs with the same math agree far
below anything a real difference in images, learning rates, accumulation or statistics would give.
"""

from __future__ import annotations

import runpy
import sys

import torch

from ddp_utils import yolo
from ddp_utils.engine import loop
from tests.multiproc import REPO_ROOT


class Float64Model(yolo.Model):
    """yolo.Model in float64, anchors and strides included."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.double()


def float64_images(images: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
    """The step's images as float64 in [0, 1] (train.py's conversion, then to float64)."""
    return _images_to_float(images, channels_last).double()


_images_to_float = loop.images_to_float

if __name__ == "__main__":
    yolo.Model = Float64Model  # train.py builds its model as yolo.Model
    loop.images_to_float = float64_images  # TrainStep.prepare converts the step's batch
    sys.argv = [str(REPO_ROOT / "train.py"), *sys.argv[1:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
