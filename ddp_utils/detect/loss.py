"""The YOLOv5 training loss: CIoU box regression, IoU-targeted objectness, BCE classes.

Targets go to every anchor whose shape is within ``hyp['anchor_t']`` of theirs (by the
larger of the width and height ratios), in their own grid cell and in the two
neighbouring cells nearest to their centre, so each object trains up to 3 cells x na
anchors per level.
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.ops import complete_box_iou_loss

from .model import Detect

_REQUIRED_HYP = ("box", "obj", "cls", "cls_pw", "obj_pw", "anchor_t")
# The centre cell plus one neighbour in each direction; a target uses the centre and the two nearest.
_NEIGHBOURS = torch.tensor([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1]], dtype=torch.float32)


def smooth_bce(eps: float = 0.0) -> tuple[float, float]:
    """Positive and negative BCE targets with label smoothing ``eps``.

    Examples:
        >>> smooth_bce(0.1)
        (0.95, 0.05)
    """
    return 1.0 - 0.5 * eps, 0.5 * eps


class FocalLoss(nn.Module):
    """Focal loss around a BCE-with-logits loss (keeps its pos_weight): down-weights easy examples.

    Examples:
        >>> loss = FocalLoss(nn.BCEWithLogitsLoss(), gamma=1.5)
        >>> float(loss(torch.zeros(4), torch.ones(4))) > 0
        True
    """

    def __init__(self, bce: nn.BCEWithLogitsLoss, gamma: float = 1.5, alpha: float = 0.25) -> None:
        super().__init__()
        self.bce = bce
        self.gamma = gamma
        self.alpha = alpha
        self.reduction = bce.reduction
        self.bce.reduction = "none"

    def forward(self, pred: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
        loss = self.bce(pred, true)
        prob = torch.sigmoid(pred)
        p_t = true * prob + (1 - true) * (1 - prob)
        alpha_factor = true * self.alpha + (1 - true) * (1 - self.alpha)
        loss = loss * alpha_factor * (1.0 - p_t) ** self.gamma
        if self.reduction == "mean":
            return loss.mean()
        return loss.sum() if self.reduction == "sum" else loss


def _cxcywh_to_xyxy(box: torch.Tensor) -> torch.Tensor:
    half = box[:, 2:4] / 2
    return torch.cat((box[:, :2] - half, box[:, :2] + half), 1)


class ComputeLoss:
    """YOLOv5's loss for a :class:`~ddp_utils.detect.model.Model` (plain, DDP- or DataParallel-wrapped).

    Args:
        model: the detector; its Detect head gives anchors, strides and nc.
        hyp: hyperparameters with ``box``, ``obj``, ``cls`` (gains, already scaled by the
            caller for layers, classes and image size), ``cls_pw``, ``obj_pw`` (BCE pos_weight),
            ``anchor_t``, and optionally ``fl_gamma`` (> 0 enables focal loss) and
            ``label_smoothing``.

    Call it with the training-mode outputs (a list of ``[B, na, ny, nx, 5 + nc]``) and the
    targets ``[n, 6]`` = (image index, class, xc, yc, w, h) normalised to the input size. It
    returns ``(loss * batch_size, tensor([box, obj, cls]).detach())``.

    Examples:
        >>> from ddp_utils.detect import Model, load_model_yaml
        >>> cfg, _ = load_model_yaml("yolov5n.yaml")
        >>> model = Model({**cfg, "width_multiple": 0.0625}, nc=2)
        >>> hyp = {"box": 0.05, "obj": 1.0, "cls": 0.5, "cls_pw": 1.0, "obj_pw": 1.0, "anchor_t": 4.0}
        >>> targets = torch.tensor([[0, 1, 0.5, 0.5, 0.2, 0.3]])
        >>> loss, items = ComputeLoss(model, hyp)(model(torch.zeros(2, 3, 64, 64)), targets)
        >>> loss.shape, items.shape, bool(loss > 0)
        (torch.Size([1]), torch.Size([3]), True)
    """

    balance_by_levels = {3: [4.0, 1.0, 0.4]}

    def __init__(self, model: nn.Module, hyp: dict) -> None:
        missing = [k for k in _REQUIRED_HYP if k not in hyp]
        if missing:
            raise KeyError(f"hyp is missing {', '.join(missing)}: the loss needs {', '.join(_REQUIRED_HYP)}")
        if hasattr(model, "module"):  # DistributedDataParallel / DataParallel
            model = model.module
        detect = model.model[-1]
        if not isinstance(detect, Detect):
            raise TypeError(f"the model's last layer is {type(detect).__name__}, not Detect")
        device = next(model.parameters()).device
        self.hyp = hyp
        self.bce_cls = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([float(hyp["cls_pw"])], device=device))
        self.bce_obj = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([float(hyp["obj_pw"])], device=device))
        gamma = float(hyp.get("fl_gamma", 0.0))
        if gamma > 0:
            self.bce_cls, self.bce_obj = FocalLoss(self.bce_cls, gamma), FocalLoss(self.bce_obj, gamma)
        self.cls_pos, self.cls_neg = smooth_bce(float(hyp.get("label_smoothing", 0.0)))
        self.balance = self.balance_by_levels.get(detect.nl, [4.0, 1.0, 0.25, 0.06, 0.02])
        self.detect = detect  # its anchors are read at each call: autoanchor may change them after this
        self.na, self.nc, self.nl = detect.na, detect.nc, detect.nl
        self.anchor_t = float(hyp["anchor_t"])

    def __call__(self, preds: list[torch.Tensor], targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device = preds[0].device
        targets = targets.to(device)
        self.bce_cls.to(device)  # pos_weight follows the model if it moved after this loss was made
        self.bce_obj.to(device)
        loss_box = torch.zeros(1, device=device)
        loss_obj = torch.zeros(1, device=device)
        loss_cls = torch.zeros(1, device=device)
        for level, (pred, (cls, box, index, anchors)) in enumerate(zip(preds, self.build_targets(preds, targets))):
            obj_target = torch.zeros(pred.shape[:4], dtype=pred.dtype, device=device)
            if cls.shape[0]:
                picked = pred[index]
                pxy, pwh, _, pcls = picked.split((2, 2, 1, self.nc), 1)
                pxy = pxy.sigmoid() * 2 - 0.5
                pwh = (pwh.sigmoid() * 2) ** 2 * anchors
                ciou_loss = complete_box_iou_loss(
                    _cxcywh_to_xyxy(torch.cat((pxy, pwh), 1).float()), _cxcywh_to_xyxy(box), reduction="none"
                )
                loss_box += ciou_loss.mean()
                # objectness learns how well its box fits: CIoU, floored at 0
                obj_target[index] = (1.0 - ciou_loss).detach().clamp(0).to(obj_target.dtype)
                if self.nc > 1:
                    cls_target = torch.full_like(pcls, self.cls_neg)
                    cls_target[torch.arange(cls.shape[0], device=device), cls] = self.cls_pos
                    loss_cls += self.bce_cls(pcls, cls_target)
            loss_obj += self.bce_obj(pred[..., 4], obj_target) * self.balance[level]
        loss_box *= self.hyp["box"]
        loss_obj *= self.hyp["obj"]
        loss_cls *= self.hyp["cls"]
        batch_size = preds[0].shape[0]
        return (loss_box + loss_obj + loss_cls) * batch_size, torch.cat((loss_box, loss_obj, loss_cls)).detach()

    def build_targets(
        self, preds: list[torch.Tensor], targets: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]]:
        """Assign targets to anchors and cells, level by level.

        Returns:
            Per level: classes [m], boxes [m, 4] (centre offset within the cell, w, h; grid units),
            indices (image, anchor, gy, gx), and the matched anchors [m, 2].
        """
        device = targets.device
        n_targets = targets.shape[0]
        anchor_index = torch.arange(self.na, device=device, dtype=torch.float32).view(self.na, 1).repeat(1, n_targets)
        # one copy of every target per anchor: [na, n, 7] = image, class, x, y, w, h, anchor
        per_anchor = torch.cat((targets.float().repeat(self.na, 1, 1), anchor_index[..., None]), 2)
        offsets_all = _NEIGHBOURS.to(device) * 0.5
        result = []
        for level, pred in enumerate(preds):
            ny, nx = pred.shape[2], pred.shape[3]
            gain = torch.tensor([1, 1, nx, ny, nx, ny, 1], device=device, dtype=torch.float32)
            t = per_anchor * gain  # to grid units
            anchors = self.detect.anchors[level].detach().to(device)
            if n_targets:
                ratio = t[..., 4:6] / anchors[:, None]
                t = t[torch.max(ratio, 1 / ratio).max(2)[0] < self.anchor_t]
                xy = t[:, 2:4]
                xy_inv = gain[[2, 3]] - xy
                # the neighbour cells on the side the centre leans to (left/up, right/down), inside the grid
                left, up = ((xy % 1 < 0.5) & (xy > 1)).T
                right, down = ((xy_inv % 1 < 0.5) & (xy_inv > 1)).T
                use = torch.stack((torch.ones_like(left), left, up, right, down))
                t = t.repeat((5, 1, 1))[use]
                offsets = (torch.zeros_like(xy)[None] + offsets_all[:, None])[use]
            else:
                t = per_anchor[0]
                offsets = torch.zeros_like(t[:, 2:4])
            image, cls = t[:, 0].long(), t[:, 1].long()
            xy, wh, anchor = t[:, 2:4], t[:, 4:6], t[:, 6].long()
            cell = (xy - offsets).long()
            gx, gy = cell[:, 0].clamp(0, nx - 1), cell[:, 1].clamp(0, ny - 1)
            box = torch.cat((xy - torch.stack((gx, gy), 1), wh), 1)
            result.append((cls, box, (image, anchor, gy, gx), anchors[anchor]))
        return result


def scale_loss_gains(hyp: dict, nl: int, nc: int, imgsz: int, label_smoothing: float = 0.0) -> dict:
    """The loss gains of ``hyp`` scaled to a model and image size, as a new dict (``hyp`` is unchanged).

    The gains in a hyp yaml are tuned for 3 detection levels, 80 classes and 640 px images:
    the box gain scales with 3 / levels, the class gain also with classes / 80, and the
    objectness gain with (imgsz / 640)^2, since the number of grid cells grows with the area.

    Args:
        hyp: hyperparameters with "box", "cls" and "obj".
        nl: the number of detection levels (``Detect.nl``).
        nc: the number of classes.
        imgsz: the training image size in pixels.
        label_smoothing: stored as ``"label_smoothing"`` for :class:`ComputeLoss`.

    Returns:
        A copy of ``hyp`` with the scaled gains.

    Examples:
        >>> hyp = {"box": 0.05, "cls": 0.5, "obj": 1.0}
        >>> scaled = scale_loss_gains(hyp, nl=3, nc=80, imgsz=320)
        >>> scaled["obj"], scaled["label_smoothing"], hyp["obj"]
        (0.25, 0.0, 1.0)
    """
    scaled = dict(hyp)
    # the factors are computed first, as YOLOv5's in-place `*=` does, so the floats are the same
    scaled["box"] = hyp["box"] * (3 / nl)
    scaled["cls"] = hyp["cls"] * (nc / 80 * 3 / nl)
    scaled["obj"] = hyp["obj"] * ((imgsz / 640) ** 2 * 3 / nl)
    scaled["label_smoothing"] = label_smoothing
    return scaled
