"""Finding a YOLOv5-style detection head on a model, whichever code built it.

The loss needs only what every YOLOv5 ``Detect`` carries: ``anchors`` (``[nl, na, 2]`` in grid
units of each level), ``stride`` (``[nl]``), ``na``, ``nc`` and ``nl``. So the head is recognised by
those attributes, not by its class: our :class:`~ddp_utils.yolo.model.Detect`, YOLOv5's own
``models.yolo.Detect`` (a different class of the same name) or a user's subclass all qualify.
"""

from __future__ import annotations

import torch
from torch import nn

HEAD_ATTRIBUTES = ("anchors", "stride", "na", "nc", "nl")


def detection_head(model: nn.Module) -> nn.Module:
    """The YOLOv5-style detection head of ``model`` (plain, DDP- or DataParallel-wrapped): its last layer.

    Args:
        model: a detector whose ``model`` attribute is the layer sequence, the head last (YOLOv5's layout).

    Returns:
        The head, with ``anchors``, ``stride``, ``na``, ``nc`` and ``nl``.

    Raises:
        TypeError: the model has no layer sequence, or its last layer lacks one of those attributes
            (or its strides are not measured yet); the message names what is missing.

    Examples:
        >>> from ddp_utils.yolo import Model, load_model_yaml
        >>> cfg, _ = load_model_yaml("yolov5n.yaml")
        >>> head = detection_head(Model({**cfg, "width_multiple": 0.0625}, nc=2))
        >>> head.nl, head.na, head.nc, head.stride.tolist()
        (3, 3, 2, [8.0, 16.0, 32.0])
    """
    model = getattr(model, "module", model)  # DistributedDataParallel / DataParallel
    layers = getattr(model, "model", None)
    if not isinstance(layers, (nn.Sequential, nn.ModuleList)) or not len(layers):
        raise TypeError(
            f"{type(model).__name__} has no layer sequence .model ending in a detection head; "
            "ComputeLoss needs a YOLOv5-style detector"
        )
    head = layers[-1]
    missing = [name for name in HEAD_ATTRIBUTES if getattr(head, name, None) is None]
    if missing:
        raise TypeError(
            f"the model's last layer {type(head).__module__}.{type(head).__name__} is not a YOLOv5-style detection "
            f"head: it has no {', '.join(missing)} (a head needs {', '.join(HEAD_ATTRIBUTES)})"
        )
    if not isinstance(head.anchors, torch.Tensor) or head.anchors.shape[:2] != (head.nl, head.na):
        raise TypeError(f"the detection head's anchors are not an [nl={head.nl}, na={head.na}, 2] tensor")
    return head
