"""The YOLOv5 training loss: CIoU box regression, IoU-targeted objectness, BCE classes.

Targets go to every anchor whose shape is within ``hyp['anchor_t']`` of theirs (by the
larger of the width and height ratios), in their own grid cell and in the two
neighbouring cells nearest to their centre, so each object trains up to 3 cells x na
anchors per level.

On a GPU the loss never waits for the device: instead of selecting the matched
(target, anchor, cell) candidates with a boolean mask (whose size the host would have to
read back), every candidate of a level keeps its slot and a 0/1 weight says whether it
counts, so every shape is known on the host from the number of targets alone. Off the
GPU the matched candidates are still selected (no wait to avoid there, less arithmetic),
which computes bit-for-bit what the selecting loss always did.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import complete_box_iou_loss

from ..boxes import xywh2xyxy
from .model import Detect

_REQUIRED_HYP = ("box", "obj", "cls", "cls_pw", "obj_pw", "anchor_t")
# The centre cell plus one neighbour in each direction; a target uses the centre and the two nearest.
_NEIGHBOURS = torch.tensor([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1]], dtype=torch.float32)


def smooth_BCE(eps: float = 0.1) -> tuple[float, float]:  # noqa: N802 (YOLOv5's name)
    """Positive and negative BCE targets with label smoothing ``eps`` (YOLOv5's name and default).

    Examples:
        >>> smooth_BCE()
        (0.95, 0.05)
        >>> smooth_BCE(0.0)
        (1.0, 0.0)
    """
    return 1.0 - 0.5 * eps, 0.5 * eps


class FocalLoss(nn.Module):
    """Focal loss around a BCE-with-logits loss (keeps its pos_weight): down-weights easy examples.

    Examples:
        >>> loss = FocalLoss(nn.BCEWithLogitsLoss(), gamma=1.5)
        >>> float(loss(torch.zeros(4), torch.ones(4))) > 0
        True
    """

    def __init__(self, loss_fcn: nn.BCEWithLogitsLoss, gamma: float = 1.5, alpha: float = 0.25) -> None:
        super().__init__()
        self.loss_fcn = loss_fcn  # YOLOv5's argument and attribute name
        self.gamma = gamma
        self.alpha = alpha
        self.reduction = loss_fcn.reduction
        self.loss_fcn.reduction = "none"

    def elementwise(self, pred: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
        """The loss of every element, unreduced."""
        loss = self.loss_fcn(pred, true)
        prob = torch.sigmoid(pred)
        p_t = true * prob + (1 - true) * (1 - prob)
        alpha_factor = true * self.alpha + (1 - true) * (1 - self.alpha)
        return loss * alpha_factor * (1.0 - p_t) ** self.gamma

    def forward(self, pred: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
        loss = self.elementwise(pred, true)
        if self.reduction == "mean":
            return loss.mean()
        return loss.sum() if self.reduction == "sum" else loss


def _elementwise(loss_fn: nn.Module, pred: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
    """``loss_fn`` (BCE-with-logits or focal) per element, so that a weighted mean can replace its mean."""
    if isinstance(loss_fn, FocalLoss):
        return loss_fn.elementwise(pred, true)
    return F.binary_cross_entropy_with_logits(
        pred, true, weight=loss_fn.weight, pos_weight=loss_fn.pos_weight, reduction="none"
    )


class LevelTargets(NamedTuple):
    """Every (neighbour cell, anchor, target) candidate of one level, matched or not.

    ``valid`` [N] says which candidates count; the others hold harmless values (a real cell,
    the anchor's own shape as the box) so that weighting them by 0 leaves no NaN behind.
    """

    cls: torch.Tensor  # [N] class
    box: torch.Tensor  # [N, 4] centre offset within the cell, w, h (grid units)
    index: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # image, anchor, gy, gx
    anchors: torch.Tensor  # [N, 2] the candidate's anchor (grid units)
    valid: torch.Tensor | None  # [N] bool; None when only the matched ones were kept


def _resolve_hyp(model: nn.Module, hyp: dict | None) -> dict:
    """``hyp`` itself, or YOLOv5's way: the dict its train.py stores as ``model.hyp``."""
    if hyp is not None:
        return hyp
    model_hyp = getattr(model, "hyp", None)
    if model_hyp is None:
        raise ValueError(
            "ComputeLoss(model): the model has no .hyp; pass the hyperparameters as ComputeLoss(model, hyp), "
            "or set model.hyp = hyp first as YOLOv5's train.py does"
        )
    return model_hyp


class ComputeLoss:
    """YOLOv5's loss for a :class:`~ddp_utils.yolo.model.Model` (plain, DDP- or DataParallel-wrapped).

    Args:
        model: the detector; its Detect head gives anchors, strides and nc.
        hyp: hyperparameters with ``box``, ``obj``, ``cls`` (gains, already scaled by the
            caller for layers, classes and image size), ``cls_pw``, ``obj_pw`` (BCE pos_weight),
            ``anchor_t``, and optionally ``fl_gamma`` (> 0 enables focal loss) and
            ``label_smoothing``. Left out (YOLOv5's ``ComputeLoss(model)``), it is read from
            ``model.hyp``.
        autobalance: YOLOv5's option: let each level's objectness weight follow the inverse of
            its loss, relative to the stride-16 level. Kept on the device (no host wait).
        dense: weight every candidate instead of selecting the matched ones (no host wait;
            about 20 % more arithmetic). None: dense on CUDA, selected elsewhere, where the
            selection costs no wait and the numbers stay bit-for-bit those of the selecting loss.

    Call it with the training-mode outputs (a list of ``[B, na, ny, nx, 5 + nc]``) and the
    targets ``[n, 6]`` = (image index, class, xc, yc, w, h) normalised to the input size. It
    returns ``(loss * batch_size, tensor([box, obj, cls]).detach())``.

    Examples:
        >>> from ddp_utils.yolo import Model, load_model_yaml
        >>> cfg, _ = load_model_yaml("yolov5n.yaml")
        >>> model = Model({**cfg, "width_multiple": 0.0625}, nc=2)
        >>> hyp = {"box": 0.05, "obj": 1.0, "cls": 0.5, "cls_pw": 1.0, "obj_pw": 1.0, "anchor_t": 4.0}
        >>> targets = torch.tensor([[0, 1, 0.5, 0.5, 0.2, 0.3]])
        >>> loss, items = ComputeLoss(model, hyp)(model(torch.zeros(2, 3, 64, 64)), targets)
        >>> loss.shape, items.shape, bool(loss > 0)
        (torch.Size([1]), torch.Size([3]), True)
        >>> model.hyp = hyp  # YOLOv5's form
        >>> ComputeLoss(model).anchor_t
        4.0
    """

    balance_by_levels = {3: [4.0, 1.0, 0.4]}

    def __init__(
        self, model: nn.Module, hyp: dict | bool | None = None, autobalance: bool = False, dense: bool | None = None
    ) -> None:
        if isinstance(hyp, bool):  # YOLOv5's positional ComputeLoss(model, autobalance)
            hyp, autobalance = None, hyp
        if hasattr(model, "module"):  # DistributedDataParallel / DataParallel
            model = model.module
        hyp = _resolve_hyp(model, hyp)
        missing = [k for k in _REQUIRED_HYP if k not in hyp]
        if missing:
            raise KeyError(f"hyp is missing {', '.join(missing)}: the loss needs {', '.join(_REQUIRED_HYP)}")
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
        self.cls_pos, self.cls_neg = smooth_BCE(float(hyp.get("label_smoothing", 0.0)))
        self.balance = list(self.balance_by_levels.get(detect.nl, [4.0, 1.0, 0.25, 0.06, 0.02]))
        self.autobalance = bool(autobalance)
        strides = [int(s) for s in detect.stride.tolist()]  # once, at construction
        self.ssi = strides.index(16) if self.autobalance and 16 in strides else 0
        self.detect = detect  # its anchors are read at each call: autoanchor may change them after this
        self.na, self.nc, self.nl = detect.na, detect.nc, detect.nl
        self.anchor_t = float(hyp["anchor_t"])
        self.dense = dense
        self._constants: dict = {}  # small per-device tensors, made once: a host-to-device copy waits

    def __call__(self, preds: list[torch.Tensor], targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device = preds[0].device
        targets = targets.to(device, non_blocking=True)
        self.bce_cls.to(device)  # pos_weight follows the model if it moved after this loss was made
        self.bce_obj.to(device)
        loss_box = torch.zeros(1, device=device)
        loss_obj = torch.zeros(1, device=device)
        loss_cls = torch.zeros(1, device=device)
        balance = []
        dense = self.dense if self.dense is not None else device.type == "cuda"
        assignment = self.dense_targets(preds, targets, select=not dense)
        for level, (pred, assigned) in enumerate(zip(preds, assignment)):
            box_term, cls_term, obj_target = self._level_terms(pred, assigned)
            loss_box += box_term
            loss_cls += cls_term
            obj_loss = self.bce_obj(pred[..., 4], obj_target)
            loss_obj += obj_loss * self.balance[level]
            if self.autobalance:
                balance.append(self.balance[level] * 0.9999 + 0.0001 / obj_loss.detach())
        if self.autobalance:  # device scalars from now on: reading them back would wait for the GPU
            self.balance = [b / balance[self.ssi] for b in balance]
        loss_box *= self.hyp["box"]
        loss_obj *= self.hyp["obj"]
        loss_cls *= self.hyp["cls"]
        batch_size = preds[0].shape[0]
        return (loss_box + loss_obj + loss_cls) * batch_size, torch.cat((loss_box, loss_obj, loss_cls)).detach()

    def _level_terms(
        self, pred: torch.Tensor, assigned: LevelTargets
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One level's box and class loss (means over the matched candidates) and its objectness target."""
        cls, box, index, anchors, valid = assigned
        dense = valid is not None
        zero = pred.new_zeros((), dtype=torch.float32)
        if not dense and not cls.shape[0]:
            return zero, zero, torch.zeros(pred.shape[:4], dtype=pred.dtype, device=pred.device)
        picked = pred[index]
        pxy, pwh, _, pcls = picked.split((2, 2, 1, self.nc), 1)
        pxy = pxy.sigmoid() * 2 - 0.5
        pwh = (pwh.sigmoid() * 2) ** 2 * anchors
        ciou_loss = complete_box_iou_loss(xywh2xyxy(torch.cat((pxy, pwh), 1).float()), xywh2xyxy(box), reduction="none")
        # objectness learns how well its box fits: CIoU, floored at 0
        obj_values = (1.0 - ciou_loss).detach().clamp(0)
        if dense:
            weight = valid.float()
            count = weight.sum().clamp(min=1)  # a device scalar: 0 candidates give a 0 loss, not a wait
            box_term = (ciou_loss * weight).sum() / count
            obj_target = _scatter_last(pred.shape[:4], index, obj_values, valid).to(pred.dtype)
        else:
            box_term = ciou_loss.mean()
            obj_target = torch.zeros(pred.shape[:4], dtype=pred.dtype, device=pred.device)
            obj_target[index] = obj_values.to(pred.dtype)
        cls_term = zero
        if self.nc > 1:
            cls_target = torch.full_like(pcls, self.cls_neg).scatter_(1, cls[:, None], self.cls_pos)
            if dense:
                per_candidate = _elementwise(self.bce_cls, pcls, cls_target).sum(1)
                cls_term = (per_candidate * weight).sum() / (count * self.nc)
            else:
                cls_term = self.bce_cls(pcls, cls_target)
        return box_term, cls_term, obj_target

    def dense_targets(
        self, preds: list[torch.Tensor], targets: torch.Tensor, select: bool = False
    ) -> list[LevelTargets]:
        """Every (neighbour, anchor, target) candidate per level with its ``valid`` flag; no host wait.

        The candidates are ordered neighbour-major, then anchor, then target: the order of the
        selected ones in :meth:`build_targets`, which decides which target a shared cell keeps.
        With ``select`` only the valid ones are kept (``valid`` is then None): less arithmetic
        where reading their number back costs no wait, i.e. off the GPU.
        """
        device = targets.device
        n_targets = targets.shape[0]
        anchor_index = torch.arange(self.na, device=device, dtype=torch.float32).view(self.na, 1).expand(-1, n_targets)
        # one copy of every target per anchor: [na, n, 7] = image, class, x, y, w, h, anchor
        per_anchor = torch.cat((targets.float().expand(self.na, -1, -1), anchor_index[..., None]), 2)
        offsets = self._constant(device, "offsets", _NEIGHBOURS * 0.5).view(5, 1, 1, 2)
        result = []
        for level, pred in enumerate(preds):
            ny, nx = pred.shape[2], pred.shape[3]
            gain = self._constant(device, (nx, ny), torch.tensor([1, 1, nx, ny, nx, ny, 1.0]))
            t = per_anchor * gain  # to grid units
            anchors = self.detect.anchors[level].detach().to(device)
            ratio = t[..., 4:6] / anchors[:, None]
            shape_ok = torch.max(ratio, 1 / ratio).max(2)[0] < self.anchor_t  # [na, n]
            xy = t[..., 2:4]
            xy_inv = gain[2:4] - xy  # a slice: a list index would be a host-to-device copy
            # the neighbour cells on the side the centre leans to (left/up, right/down), inside the grid
            left, up = ((xy % 1 < 0.5) & (xy > 1)).unbind(-1)
            right, down = ((xy_inv % 1 < 0.5) & (xy_inv > 1)).unbind(-1)
            valid = (torch.stack((torch.ones_like(left), left, up, right, down)) & shape_ok).reshape(-1)
            t = t.expand(5, -1, -1, -1).reshape(-1, 7)
            shift = (xy.new_zeros(1, self.na, n_targets, 2) + offsets).reshape(-1, 2)
            if select:
                t, shift, valid = t[valid], shift[valid], None
            image, cls, anchor = t[:, 0].long(), t[:, 1].long(), t[:, 6].long()
            xy, wh = t[:, 2:4], t[:, 4:6]
            cell = (xy - shift).long()
            gx, gy = cell[:, 0].clamp(0, nx - 1), cell[:, 1].clamp(0, ny - 1)
            matched = anchors[anchor]
            box = torch.cat((xy - torch.stack((gx, gy), 1), wh), 1)
            if valid is not None:  # an unmatched candidate's box becomes its anchor's, centred: finite CIoU
                box = torch.where(valid[:, None], box, torch.cat((torch.full_like(xy, 0.5), matched), 1))
            result.append(LevelTargets(cls, box, (image, anchor, gy, gx), matched, valid))
        return result

    def build_targets(
        self, preds: list[torch.Tensor], targets: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]]:
        """Assign targets to anchors and cells, level by level: the matched candidates only.

        For inspection (selecting the matched ones waits for the device); the loss itself uses
        :meth:`dense_targets`.

        Returns:
            Per level: classes [m], boxes [m, 4] (centre offset within the cell, w, h; grid units),
            indices (image, anchor, gy, gx), and the matched anchors [m, 2].
        """
        assignment = self.dense_targets(preds, targets.to(preds[0].device), select=True)
        return [(cls, box, index, anchors) for cls, box, index, anchors, _ in assignment]

    def _constant(self, device: torch.device, key: object, value: torch.Tensor) -> torch.Tensor:
        """``value`` on ``device``, copied there once per key (a host-to-device copy waits for the GPU)."""
        cached = self._constants.get((device, key))
        if cached is None:
            cached = self._constants[(device, key)] = value.to(device)
        return cached


def _scatter_last(
    shape: torch.Size, index: tuple[torch.Tensor, ...], values: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """A zero tensor of ``shape`` with ``values`` written at ``index`` where ``valid``.

    Where several valid candidates share a cell, the last one wins (what a sequential
    ``t[index] = values`` does), but deterministically on every device: each cell
    finds its last writer by a scatter-max over candidate positions.
    """
    image, anchor, gy, gx = index
    _, na, ny, nx = shape
    cells = shape.numel()
    flat = ((image * na + anchor) * ny + gy) * nx + gx
    flat = torch.where(valid, flat, cells)  # the unmatched write to one spare slot past the end
    position = torch.arange(flat.shape[0], device=flat.device)
    last = torch.full((cells + 1,), -1, dtype=torch.long, device=flat.device)
    last.scatter_reduce_(0, flat, position, reduce="amax")
    last = last[:cells]
    padded = torch.cat((values, values.new_zeros(1)))  # position -1 reads the 0 at the end
    return padded[last].view(shape)


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
