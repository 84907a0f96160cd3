"""The reference detector: a YOLOv5-style model built from a model yaml, its loss, box ops and COCO metrics.

``head.py`` finds a YOLOv5-style detection head by its attributes (ours or YOLOv5's own ``Detect``);
``foreign.py`` reads YOLOv5's pickled checkpoints as inert records, ``repickle.py`` writes such records back.
"""

from .blocks import C3, SPP, SPPF, Bottleneck, Concat, Conv, Focus, autopad
from .evaluate import ValidationInterrupted, evaluate
from .finetune import check_img_size, freeze_indices, freeze_layers, grid_size, transfer_weights
from .foreign import ForeignCheckpointError, UltralyticsCheckpointError, read_yolov5_checkpoint, yolov5_model
from .head import detection_head
from .loss import ComputeLoss, FocalLoss, scale_loss_gains, smooth_BCE
from .metrics import ClassMetrics, DetectionMetrics, ImageRecord, class_maps, class_table, coco_metrics, fitness
from .model import MODULES, Detect, Model, ModelConfigError, load_model_yaml, make_divisible, parse_model
from .ops import (
    clip_boxes,
    letterbox_params,
    non_max_suppression,
    scale_boxes,
    xywh2xyxy,
    xywhn2xyxy,
    xyxy2xywh,
    xyxy2xywhn,
)

__all__ = [
    "detection_head",
    "transfer_weights",
    "scale_loss_gains",
    "grid_size",
    "freeze_layers",
    "freeze_indices",
    "check_img_size",
    "C3",
    "MODULES",
    "SPP",
    "SPPF",
    "Bottleneck",
    "ComputeLoss",
    "ClassMetrics",
    "Concat",
    "Conv",
    "Detect",
    "DetectionMetrics",
    "FocalLoss",
    "Focus",
    "ForeignCheckpointError",
    "ImageRecord",
    "Model",
    "ModelConfigError",
    "UltralyticsCheckpointError",
    "autopad",
    "class_maps",
    "class_table",
    "clip_boxes",
    "coco_metrics",
    "ValidationInterrupted",
    "evaluate",
    "fitness",
    "letterbox_params",
    "load_model_yaml",
    "make_divisible",
    "non_max_suppression",
    "parse_model",
    "read_yolov5_checkpoint",
    "scale_boxes",
    "smooth_BCE",
    "xywh2xyxy",
    "xywhn2xyxy",
    "xyxy2xywh",
    "xyxy2xywhn",
    "yolov5_model",
]
