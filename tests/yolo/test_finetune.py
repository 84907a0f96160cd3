"""yolo/finetune.py: pretrained tensors by name and shape, frozen layers, the image size on the stride."""

from __future__ import annotations

import pytest
import torch

from ddp_utils.yolo import Model, check_img_size, freeze_indices, freeze_layers, grid_size, transfer_weights


def test_transfer_to_another_class_count_fills_all_but_the_class_rows():
    torch.manual_seed(0)
    source = Model("yolov5n.yaml", ch=3, nc=80)
    target = Model("yolov5n.yaml", ch=3, nc=3)
    done, total = transfer_weights(target, source.state_dict())
    head = {k for k in target.state_dict() if k.startswith("model.24.m.")}  # the head's per-class convolutions
    assert head and done == total - len(head)
    for name, value in target.state_dict().items():
        if name not in head:
            assert torch.equal(value, source.state_dict()[name]), name
    assert not torch.equal(target.state_dict()["model.24.m.0.bias"][:8], source.state_dict()["model.24.m.0.bias"][:8])


def test_transfer_ignores_unknown_names():
    target = Model("yolov5n.yaml", ch=3, nc=3)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    assert transfer_weights(target, {"no.such.weight": torch.zeros(3)}) == (0, len(before))
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_freeze_first_n_layers_or_the_listed_ones():
    model = Model("yolov5n.yaml", ch=3, nc=3)
    frozen = freeze_layers(model, freeze_indices([10]))
    assert frozen and all(name.split(".")[1] in {str(i) for i in range(10)} for name in frozen)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(int(n.split(".")[1]) >= 10 for n in trainable)
    frozen = freeze_layers(model, freeze_indices([2, 24]))  # a second call replaces the first
    assert {n.split(".")[1] for n in frozen} == {"2", "24"}
    assert freeze_layers(model, freeze_indices([0])) == []
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize(("imgsz", "stride", "expected"), [(640, 32, 640), (100, 32, 128), (129, 64, 192), (1, 32, 32)])
def test_check_img_size_rounds_up_to_the_stride(imgsz, stride, expected):
    assert check_img_size(imgsz, stride) == expected


def test_grid_size_is_the_largest_stride_and_at_least_32():
    model = Model("yolov5n.yaml", ch=3, nc=3)
    assert grid_size(model) == 32
    model.model[-1].stride = torch.tensor([8.0, 16.0])
    assert grid_size(model) == 32


def test_freeze_refuses_layers_the_model_lacks_and_freezing_everything():
    model = Model("yolov5n.yaml", nc=4)  # layers 0-24
    with pytest.raises(ValueError, match=r"^--freeze: layer 40 is not in the model, whose layers are 0-24$"):
        freeze_layers(model, freeze_indices([2, 40]))
    with pytest.raises(ValueError, match=r"every layer with parameters \(of 0-24\) would be frozen"):
        freeze_layers(model, freeze_indices([30]))  # YOLOv5's "first 30" on a 25-layer model
    assert len(freeze_layers(model, freeze_indices([24]))) > 0  # all but the head: the head still trains
