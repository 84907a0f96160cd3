"""The YOLOv5 training loss: CIoU box regression, IoU-targeted objectness, BCE classes.

Targets go to every anchor whose shape is within ``hyp['anchor_t']`` of theirs (by the
larger of the width and height ratios), in their own grid cell and in the two
neighbouring cells nearest to their centre, so each object trains up to 3 cells x na
anchors per level.

On a GPU the loss never waits for the device: instead of selecting the matched
(target, anchor, cell) candidates with a boolean mask (whose size the host would have to
read back), every candidate of a level keeps its slot and a 0/1 weight says whether it
counts, so every shape is known on the host from the number of targets alone. Off the
GPU the matched candidates are still selected (no wait to avoid there, less arithmetic).

The three levels are computed together (one assignment, one CIoU, one objectness scatter),
since on a GPU every op is a kernel launch, and the box term is a CIoU written without a
boolean mask (:func:`ciou_loss`), in float32 under any autocast.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.collectives import reduce_tensor
from ..distributed.group import get_world_size
from .head import detection_head

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


class _Candidates(NamedTuple):
    """The candidates of all levels at once, ``[nl, N]`` leading (N = 5 neighbours x na x targets)."""

    cls: torch.Tensor  # [nl, N] long
    box: torch.Tensor  # [nl, N, 4] centre offset within the cell, w, h (grid units)
    image: torch.Tensor  # [nl, N] long
    anchor: torch.Tensor  # [nl, N] long
    gy: torch.Tensor  # [nl, N] long
    gx: torch.Tensor  # [nl, N] long
    cell: torch.Tensor  # [nl, N] long: the candidate's row in its level's predictions viewed as [-1, no]
    anchors: torch.Tensor  # [nl, N, 2] the candidate's anchor shape (grid units)
    valid: torch.Tensor  # [nl, N] bool


def ciou_loss(pxy: torch.Tensor, pwh: torch.Tensor, txy: torch.Tensor, twh: torch.Tensor, eps: float = 1e-7):
    """``1 - CIoU`` of boxes given as centres and sizes (``[..., 2]`` each), without a mask: no host wait.

    The complete IoU (Zheng et al., 2020) subtracts from the IoU the squared centre distance over
    the squared diagonal of the smallest enclosing box, and an aspect-ratio term whose weight
    ``alpha`` carries no gradient. The intersection is clamped at 0, so boxes that do not meet
    need no boolean selection (which on a GPU would wait for the host).

    Examples:
        >>> xy, wh = torch.tensor([[1.0, 1.0]]), torch.tensor([[2.0, 2.0]])
        >>> float(ciou_loss(xy, wh, xy, wh)) < 1e-6, round(float(ciou_loss(xy, wh, xy + 4, wh)), 3)
        (True, 1.444)
    """
    p_half, t_half = pwh * 0.5, twh * 0.5
    p_lo, p_hi, t_lo, t_hi = pxy - p_half, pxy + p_half, txy - t_half, txy + t_half
    inter = (torch.minimum(p_hi, t_hi) - torch.maximum(p_lo, t_lo)).clamp(min=0).prod(-1)
    union = pwh.prod(-1) + twh.prod(-1) - inter
    iou = inter / (union + eps)
    hull = torch.maximum(p_hi, t_hi) - torch.minimum(p_lo, t_lo)
    distance = (pxy - txy).pow(2).sum(-1) / (hull.pow(2).sum(-1) + eps)
    angles = torch.atan(torch.stack((twh[..., 0], pwh[..., 0]), -1) / torch.stack((twh[..., 1], pwh[..., 1]), -1))
    v = (4 / math.pi**2) * (angles[..., 0] - angles[..., 1]).pow(2)
    with torch.no_grad():
        alpha = v / (1 - iou + v + eps)
    return 1 - iou + distance + alpha * v


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
            selection costs no wait.
        across_ranks: in a process group, divide the box and class sums by the whole group's
            matched candidates (one all-reduce per training call), not this rank's (as YOLOv5 does),
            so N ranks x B images train as one process with N x B. Calls under ``no_grad``
            (evaluation, whose batch counts may differ per rank) keep their own counts.

    Call it with the training-mode outputs (a list of ``[B, na, ny, nx, 5 + nc]``) and the
    targets ``[n, 6]`` = (image index, class, xc, yc, w, h) normalised to the input size. It
    returns ``(loss * batch_size, tensor([box, obj, cls]).detach())``, computed in float32
    whatever the autocast dtype of the predictions.

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
        self,
        model: nn.Module,
        hyp: dict | bool | None = None,
        autobalance: bool = False,
        dense: bool | None = None,
        *,
        across_ranks: bool = False,
    ) -> None:
        if isinstance(hyp, bool):  # YOLOv5's positional ComputeLoss(model, autobalance)
            hyp, autobalance = None, hyp
        if hasattr(model, "module"):  # DistributedDataParallel / DataParallel
            model = model.module
        hyp = _resolve_hyp(model, hyp)
        missing = [k for k in _REQUIRED_HYP if k not in hyp]
        if missing:
            raise KeyError(f"hyp is missing {', '.join(missing)}: the loss needs {', '.join(_REQUIRED_HYP)}")
        detect = detection_head(model)  # ours or YOLOv5's own Detect: found by its attributes, not its class
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
        self.across_ranks = across_ranks
        self._constants: dict = {}  # small per-device tensors, made once: a host-to-device copy waits

    def __call__(self, preds: list[torch.Tensor], targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device = preds[0].device
        targets = targets.to(device, non_blocking=True)
        self.bce_cls.to(device)  # pos_weight follows the model if it moved after this loss was made
        self.bce_obj.to(device)
        dense = self.dense if self.dense is not None else device.type == "cuda"
        found = self._candidates(preds, targets)
        nl, n_candidates = found.valid.shape
        # every level's candidates in one batch: [nl * N] rows (the matched ones only when selecting)
        picked = torch.stack([p.reshape(-1, p.shape[-1]).index_select(0, c) for p, c in zip(preds, found.cell)])
        picked, box, anchors = picked.flatten(0, 1).float(), found.box.flatten(0, 1), found.anchors.flatten(0, 1)
        cls = found.cls.flatten()
        if dense:
            weight = found.valid.flatten().float()
            sizes = None
            count = found.valid.sum(1).clamp(min=1)  # device scalars: 0 candidates give a 0 loss, not a wait
        else:
            rows = found.valid.flatten().nonzero().squeeze(1)  # waits for the host: off the GPU only
            picked, box, anchors, cls = picked[rows], box[rows], anchors[rows], cls[rows]
            sizes = found.valid.sum(1).tolist()
            count = torch.tensor(sizes, device=device).clamp(min=1)
        if self.across_ranks and torch.is_grad_enabled() and get_world_size() > 1:
            count = self._group_count(found.valid.sum(1), preds[0].shape[0])
        pxy = picked[:, :2].sigmoid() * 2 - 0.5
        pwh = (picked[:, 2:4].sigmoid() * 2) ** 2 * anchors
        box_loss = ciou_loss(pxy, pwh, box[:, :2], box[:, 2:])
        loss_box = (_per_level(box_loss, weight if dense else None, sizes, nl) / count).sum()
        loss_cls = box_loss.new_zeros(())
        if self.nc > 1:
            pcls = picked[:, 5:]
            cls_target = torch.full_like(pcls, self.cls_neg).scatter_(1, cls[:, None], self.cls_pos)
            per_row = _elementwise(self.bce_cls, pcls, cls_target).sum(1)
            loss_cls = (_per_level(per_row, weight if dense else None, sizes, nl) / (count * self.nc)).sum()
        # objectness learns how well its box fits: CIoU, floored at 0; every level's cells in one scatter
        obj_values = (1.0 - box_loss).detach().clamp(0)
        obj_targets = self._objectness_targets(preds, found, obj_values, None if dense else rows, n_candidates)
        loss_obj = box_loss.new_zeros(())
        balance = []
        for level, (pred, obj_target) in enumerate(zip(preds, obj_targets)):
            obj_loss = self.bce_obj(pred[..., 4].float(), obj_target)
            loss_obj = loss_obj + obj_loss * self.balance[level]
            if self.autobalance:
                balance.append(self.balance[level] * 0.9999 + 0.0001 / obj_loss.detach())
        if self.autobalance:  # device scalars from now on: reading them back would wait for the GPU
            self.balance = [b / balance[self.ssi] for b in balance]
        items = torch.stack((loss_box * self.hyp["box"], loss_obj * self.hyp["obj"], loss_cls * self.hyp["cls"]))
        return (items.sum() * preds[0].shape[0]).view(1), items.detach()

    @staticmethod
    def _group_count(local: torch.Tensor, batch_size: int) -> torch.Tensor:
        """Per level, the group's matched candidates x this rank's share of the group's images.

        The ranks' losses then add up to one process's over the global batch (DDP averages them).
        """
        counts = torch.cat((local.to(torch.float64), local.new_full((1,), batch_size, dtype=torch.float64)))
        total = reduce_tensor(counts, op="sum")
        return (total[:-1].clamp(min=1) * (batch_size / total[-1])).float()  # 0 matched anywhere: the sums are 0

    def _objectness_targets(
        self, preds: list[torch.Tensor], found: _Candidates, values: torch.Tensor, rows: torch.Tensor | None, n: int
    ) -> list[torch.Tensor]:
        """Per level a ``[B, na, ny, nx]`` float32 target: 0, or the CIoU of the candidate that wrote the cell."""
        sizes = [p.shape[:4].numel() for p in preds]
        offsets = self._constant(values.device, ("offsets", *sizes), torch.tensor([0, *sizes[:-1]]).cumsum(0))
        flat = (found.cell + offsets[:, None]).flatten()
        if rows is None:
            target = _scatter_last(sum(sizes), flat, values, found.valid.flatten())
        else:
            target = _scatter_last(sum(sizes), flat.index_select(0, rows), values, None)
        return [t.view(p.shape[:4]) for t, p in zip(target.split(sizes), preds)]

    def _candidates(self, preds: list[torch.Tensor], targets: torch.Tensor) -> _Candidates:
        """Every (neighbour, anchor, target) candidate of every level, computed for all levels at once."""
        device = targets.device
        na, nl, n_targets = self.na, self.nl, targets.shape[0]
        shapes = tuple((p.shape[2], p.shape[3]) for p in preds)
        gain = self._constant(device, ("gain", shapes), torch.tensor([[1, 1, nx, ny, nx, ny] for ny, nx in shapes]))
        grid = self._constant(device, ("grid", shapes), torch.tensor(shapes).view(nl, 1, 1, 1, 2))  # ny, nx
        offsets = self._constant(device, "offsets", (_NEIGHBOURS * 0.5).view(1, 5, 1, 1, 2))
        t = targets.float()[None, None] * gain[:, None, None].float()  # [nl, 1, n, 6] in grid units
        anchors = self.detect.anchors.detach().to(device)[:, :, None]  # [nl, na, 1, 2]
        ratio = t[..., 4:6] / anchors
        shape_ok = torch.max(ratio, 1 / ratio).amax(-1) < self.anchor_t  # [nl, na, n]
        xy, wh = t[..., 2:4], t[..., 4:6]  # [nl, 1, n, 2]
        xy_inv = gain[:, None, None, 2:4] - xy
        # the neighbour cells on the side the centre leans to (left/up, right/down), inside the grid
        left, up = ((xy % 1 < 0.5) & (xy > 1)).unbind(-1)
        right, down = ((xy_inv % 1 < 0.5) & (xy_inv > 1)).unbind(-1)
        valid = torch.stack((torch.ones_like(left), left, up, right, down), 1) & shape_ok[:, None]  # [nl, 5, na, n]
        xy = xy[:, None]  # [nl, 1, 1, n, 2]
        cell = torch.minimum((xy - offsets).long().clamp(min=0), grid.flip(-1) - 1)  # gx, gy: [nl, 5, 1, n, 2]
        cell = cell.expand(-1, -1, na, -1, -1)
        gx, gy = cell.unbind(-1)
        anchor = torch.arange(na, device=device).view(1, 1, na, 1).expand_as(gx)
        image = targets[:, 0].long().expand_as(gx)
        box = torch.cat((xy - cell, wh[:, None].expand(-1, 5, na, -1, -1)), -1)
        matched = anchors[:, None].expand(-1, 5, -1, n_targets, -1)
        # an unmatched candidate's box becomes its anchor's, centred: a finite CIoU that weighs 0
        box = torch.where(valid[..., None], box, torch.cat((torch.full_like(matched, 0.5), matched), -1))
        rows_per_cell = grid[..., 0] * grid[..., 1]  # ny * nx per level: [nl, 1, 1, 1]
        flat_cell = (image * na + anchor) * rows_per_cell + gy * grid[..., 1] + gx
        n = 5 * na * n_targets
        return _Candidates(
            targets[:, 1].long().expand_as(gx).reshape(nl, n),
            box.reshape(nl, n, 4),
            image.reshape(nl, n),
            anchor.reshape(nl, n),
            gy.reshape(nl, n),
            gx.reshape(nl, n),
            flat_cell.reshape(nl, n),
            matched.reshape(nl, n, 2),
            valid.reshape(nl, n),
        )

    def dense_targets(
        self, preds: list[torch.Tensor], targets: torch.Tensor, select: bool = False
    ) -> list[LevelTargets]:
        """Every (neighbour, anchor, target) candidate per level with its ``valid`` flag; no host wait.

        The candidates are ordered neighbour-major, then anchor, then target: the order of the
        selected ones in :meth:`build_targets`, which decides which target a shared cell keeps.
        With ``select`` only the valid ones are kept (``valid`` is then None): selecting waits
        for the device.
        """
        found = self._candidates(preds, targets.to(preds[0].device))
        result = []
        for level in range(self.nl):
            cls, box, image, anchor, gy, gx, _, anchors, valid = (v[level] for v in found)
            level_targets = LevelTargets(cls, box, (image, anchor, gy, gx), anchors, valid)
            if select:
                keep = valid.nonzero().squeeze(1)
                level_targets = LevelTargets(
                    cls[keep], box[keep], tuple(i[keep] for i in (image, anchor, gy, gx)), anchors[keep], None
                )
            result.append(level_targets)
        return result

    def build_targets(
        self, preds: list[torch.Tensor], targets: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]]:
        """Assign targets to anchors and cells, level by level: the matched candidates only.

        For inspection (selecting the matched ones waits for the device); the loss itself weights
        every candidate of :meth:`dense_targets` on a GPU.

        Returns:
            Per level: classes [m], boxes [m, 4] (centre offset within the cell, w, h; grid units),
            indices (image, anchor, gy, gx), and the matched anchors [m, 2].
        """
        return [(c, b, i, a) for c, b, i, a, _ in self.dense_targets(preds, targets, select=True)]

    def _constant(self, device: torch.device, key: object, value: torch.Tensor) -> torch.Tensor:
        """``value`` on ``device``, copied there once per key (a host-to-device copy waits for the GPU)."""
        cached = self._constants.get((device, key))
        if cached is None:
            cached = self._constants[(device, key)] = value.to(device)
        return cached


def _per_level(values: torch.Tensor, weight: torch.Tensor | None, sizes: list[int] | None, nl: int) -> torch.Tensor:
    """The sum of ``values`` per level, ``[nl]``: weighted rows of equal-size levels, or selected rows of ``sizes``."""
    if weight is not None:
        return (values * weight).view(nl, -1).sum(1)
    return torch.stack([part.sum() for part in values.split(sizes)])


def _scatter_last(cells: int, flat: torch.Tensor, values: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """A zero float tensor of ``cells`` with ``values`` written at ``flat`` (where ``valid``).

    Where several candidates share a cell, the last one wins (what a sequential
    ``t[index] = values`` does), but deterministically on every device: each cell
    finds its last writer by a scatter-max over candidate positions.
    """
    if valid is not None:
        flat = torch.where(valid, flat, cells)  # the unmatched write to one spare slot past the end
    position = torch.arange(flat.shape[0], device=flat.device)
    last = torch.full((cells + 1,), -1, dtype=torch.long, device=flat.device)
    last.scatter_reduce_(0, flat, position, reduce="amax")
    padded = torch.cat((values.float(), values.new_zeros(1, dtype=torch.float32)))  # position -1 reads the 0
    return padded[last[:cells]]


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
