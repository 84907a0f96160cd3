"""The yaml-built detector: architecture figures against YOLOv5's published table, modes, fusion, bad yamls."""

from __future__ import annotations

import builtins
import copy
import logging

import pytest
import thop
import torch
import yaml

from ddp_utils.yamls import asset_dir
from ddp_utils.yolo import Conv, Detect, Model, ModelConfigError, load_model_yaml, make_divisible

# Published YOLOv5 v6+ figures at 640 px: parameters (M) and GFLOPs of the fused model.
PUBLISHED = {
    "n": (1.9, 4.5),
    "s": (7.2, 16.5),
    "m": (21.2, 49.0),
    "l": (46.5, 109.1),
    "x": (86.7, 205.7),
}


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def gflops(model: torch.nn.Module, size: int) -> float:
    """thop's count (2 x MACs) on a copy of the model at size x size."""
    macs, _ = thop.profile(copy.deepcopy(model), inputs=(torch.zeros(1, 3, size, size),), verbose=False)
    return 2 * macs / 1e9


def tiny_cfg(**overrides) -> dict:
    cfg, _ = load_model_yaml("yolov5n.yaml")
    return {**cfg, "width_multiple": 0.0625, **overrides}


def test_yolov5n_exact_architecture():
    model = Model("yolov5n.yaml")
    assert n_params(model) == 1_872_157
    assert model.nc == 80 and model.stride.tolist() == [8.0, 16.0, 32.0]
    assert len(model.model) == 25 and model.save == [4, 6, 10, 14, 17, 20, 23]


@pytest.mark.parametrize("size", ["n", "s"])
def test_fused_params_and_gflops_at_640_match_the_table(size):
    model = Model(f"yolov5{size}.yaml").eval().fuse()
    params_m, gflops_640 = n_params(model) / 1e6, gflops(model, 640)
    published_params, published_gflops = PUBLISHED[size]
    assert round(params_m, 1) == published_params  # the table rounds to 0.1 M
    assert abs(gflops_640 / published_gflops - 1) < 0.01, gflops_640
    # the figures YOLOv5 prints for its fused n and s models
    assert n_params(model) == {"n": 1_867_405, "s": 7_225_885}[size]
    if size == "n":  # every feature map divides evenly, so FLOPs scale exactly with the image area
        assert gflops(model, 64) * 100 == pytest.approx(gflops_640, rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("size", ["m", "l", "x"])
def test_larger_models_match_the_table(size, monkeypatch):
    monkeypatch.setattr(Model, "stride_probe_size", 64)  # same strides, a 16th of the probe's cost
    model = Model(f"yolov5{size}.yaml").eval().fuse()
    published_params, published_gflops = PUBLISHED[size]
    assert abs(n_params(model) / 1e6 - published_params) <= 0.05 + 1e-9
    assert abs(gflops(model, 64) * 100 / published_gflops - 1) < 0.01  # profiled at 64 px, scaled to 640


def test_shipped_yamls_are_plain_yolov5_yamls():
    names = sorted(p.name for p in asset_dir("configs/models").glob("yolov5*.yaml"))
    assert names == [f"yolov5{s}.yaml" for s in "lmnsx"]
    for name in names:
        cfg = yaml.safe_load((asset_dir("configs/models") / name).read_text())
        assert set(cfg) == {"nc", "depth_multiple", "width_multiple", "anchors", "backbone", "head"}
        assert cfg["anchors"][0] == [10, 13, 16, 30, 33, 23]
        assert cfg["head"][-1] == [[17, 20, 23], 1, "Detect", ["nc", "anchors"]]


def test_channel_and_depth_rounding():
    model = Model(tiny_cfg(depth_multiple=0.33))
    stem = model.model[0]
    assert stem.conv.out_channels == make_divisible(64 * 0.0625) == 8
    assert len(model.model[4].m) == max(round(6 * 0.33), 1) == 2
    assert len(model.model[2].m) == 1


def test_train_mode_shapes_and_backward():
    torch.manual_seed(0)
    model = Model(tiny_cfg(), nc=4).train()
    out = model(torch.rand(2, 3, 96, 128))
    assert [tuple(o.shape) for o in out] == [(2, 3, 12, 16, 9), (2, 3, 6, 8, 9), (2, 3, 3, 4, 9)]
    sum(o.float().pow(2).mean() for o in out).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_eval_mode_decodes_to_input_pixels():
    model = Model(tiny_cfg(), nc=2).eval()
    with torch.no_grad():
        pred, raw = model(torch.rand(1, 3, 64, 96))
    assert pred.shape == (1, 3 * (8 * 12 + 4 * 6 + 2 * 3), 7)
    assert [tuple(r.shape) for r in raw] == [(1, 3, 8, 12, 7), (1, 3, 4, 6, 7), (1, 3, 2, 3, 7)]
    assert ((pred[..., 4:] >= 0) & (pred[..., 4:] <= 1)).all()  # sigmoid scores
    # centres lie within half a cell of their grid cell, so within the image plus a margin
    assert pred[..., 0].min() > -16 and pred[..., 0].max() < 96 + 16


def test_anchors_are_stored_in_grid_units_and_ordered_by_stride():
    model = Model(tiny_cfg())
    detect = model.model[-1]
    assert torch.allclose(detect.anchors[0] * 8, torch.tensor([[10.0, 13], [16, 30], [33, 23]]))
    backwards = tiny_cfg(anchors=list(reversed(tiny_cfg()["anchors"])))
    flipped = Model(backwards).model[-1]
    assert torch.allclose(flipped.anchors, detect.anchors)


def test_fuse_keeps_outputs():
    torch.manual_seed(0)
    model = Model(tiny_cfg(), nc=3)
    for m in model.modules():  # non-trivial batch-norm statistics, as after training
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    model.eval()
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        before = model(x)[0]
        model.fuse()
        after = model(x)[0]
    assert all(m.fused for m in model.modules() if isinstance(m, Conv))
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert (before - after).abs().max() < 1e-4


def test_channels_last():
    torch.manual_seed(0)
    model = Model(tiny_cfg(), nc=2).eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        reference = model(x)[0]
        model = model.to(memory_format=torch.channels_last)
        out = model(x.contiguous(memory_format=torch.channels_last))[0]
    assert torch.allclose(out, reference, atol=1e-5)
    model.train()
    loss = sum(o.sum() for o in model(x.contiguous(memory_format=torch.channels_last)))
    loss.backward()


def test_nc_override_is_logged(caplog):
    with caplog.at_level(logging.INFO, logger="ddp_utils"):
        model = Model(tiny_cfg(), nc=3)
    assert model.nc == 3 and model.yaml["nc"] == 3 and model.model[-1].no == 8
    assert "overriding nc=80 with nc=3" in caplog.text


def test_bias_priors():
    model = Model(tiny_cfg(), nc=4)
    detect = model.model[-1]
    bias = detect.m[0].bias.view(detect.na, -1)
    assert torch.allclose(bias[:, 4], torch.tensor(float(torch.log(torch.tensor(8 / 80**2)))))
    assert torch.allclose(bias[:, 5:], torch.log(torch.tensor(0.6 / 3.01)))
    model.initialize_biases(torch.tensor([10.0, 30.0, 60.0, 0.0]))
    expected = torch.log(torch.tensor([10.0, 30.0, 60.0, 10.0]) / 110.0)
    assert torch.allclose(detect.m[2].bias.view(detect.na, -1)[:, 5:], expected.expand(3, 4))
    with pytest.raises(ValueError, match="nc=4"):
        model.initialize_biases(torch.ones(3))


def test_model_from_a_user_yaml_file(tmp_path):
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(tiny_cfg(nc=5)))
    model = Model(str(path))
    assert model.nc == 5 and model.yaml_file == str(path)


# --- bad yamls ----------------------------------------------------------------------------------


def _bad(mutate) -> dict:
    cfg = tiny_cfg()
    cfg["backbone"] = copy.deepcopy(cfg["backbone"])
    cfg["head"] = copy.deepcopy(cfg["head"])
    mutate(cfg)
    return cfg


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c["backbone"].__setitem__(2, [-1, 3, "C4", [128]]), r"layer 2 .*unknown module 'C4'"),
        (lambda c: c["backbone"].__setitem__(1, [-1, 1, "Conv", [128, 3, 2, 1, 1, 1, True, 9]]), r"layer 1 .*Conv"),
        (lambda c: c["backbone"].__setitem__(3, [7, 1, "Conv", [256, 3, 2]]), r"layer 3 .*refers to layer 7"),
        (lambda c: c["head"].__setitem__(2, [[-1, 60], 1, "Concat", [1]]), r"layer 12 .*refers to layer 60"),
        (lambda c: c["backbone"].__setitem__(0, [-1, 1, "Conv"]), r"layer 0 .*\[from, number, module, args\]"),
        (lambda c: c["backbone"].__setitem__(0, [-1, 0, "Conv", [64]]), r"layer 0 .*number=0"),
        (lambda c: c.__setitem__("depth_multiple", "0.33x"), r"depth_multiple='0.33x' must be a positive number"),
        (lambda c: c.__setitem__("width_multiple", None), r"width_multiple=None"),
        (lambda c: c.__setitem__("nc", "eighty"), r"nc='eighty'"),
        (lambda c: c.__setitem__("anchors", [[10, 13, 16]]), r"anchors="),
        (lambda c: c["head"].__setitem__(-1, [[17, 20], 1, "Detect", ["nc", "anchors"]]), r"layer 24 .*2 layers"),
        (lambda c: c["head"].__setitem__(-1, [[17, 20, 23], 1, "Detect", [0, "anchors"]]), r"layer 24 .*class count 0"),
    ],
)
def test_bad_yaml_is_a_named_error(tmp_path, mutate, message):
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(_bad(mutate)))
    with pytest.raises(ModelConfigError, match=message) as info:
        Model(str(path))
    assert "broken.yaml" in str(info.value)


def test_yaml_text_is_never_evaluated(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    payload = f"__import__('pathlib').Path({str(marker)!r}).touch()"

    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec called while building a model")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    for spec in ([-1, 1, payload, [64]], [-1, 1, "Conv", [payload, 3, 2]], [-1, 1, "Conv", [64, payload]]):
        cfg = _bad(lambda c, spec=spec: c["backbone"].__setitem__(0, spec))
        with pytest.raises(ModelConfigError, match="layer 0"):
            Model(cfg)
    assert not marker.exists()


def test_missing_yaml_names_the_path():
    with pytest.raises(FileNotFoundError, match="no_such_model.yaml"):
        Model("no_such_model.yaml")


def test_detect_without_anchor_key_is_a_named_error():
    cfg = tiny_cfg()
    del cfg["anchors"]
    with pytest.raises(ModelConfigError, match="<dict>: layer 24 .*anchors"):
        Model(cfg)


def test_detect_is_exported():
    assert isinstance(Model(tiny_cfg()).model[-1], Detect)


def test_anchor_count_instead_of_anchor_list_builds():
    model = Model(tiny_cfg(anchors=3))  # "anchors: 3" in a yaml: anchors to be found by autoanchor
    detect = model.model[-1]
    assert detect.anchors.shape == (3, 3, 2) and model.stride.tolist() == [8.0, 16.0, 32.0]


def test_deepcopy_and_state_dict_round_trip():
    torch.manual_seed(0)
    model = Model(tiny_cfg(), nc=2).eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        reference = model(x)[0]
        twin = copy.deepcopy(model)  # what an EMA does
        assert torch.equal(twin(x)[0], reference)
        fresh = Model(tiny_cfg(), nc=2).eval()
        fresh.load_state_dict(model.state_dict())
        assert torch.equal(fresh(x)[0], reference)


def test_eval_decoding_follows_anchors_changed_in_place():
    model = Model(tiny_cfg()).eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        before = model(x)[0]
        model.model[-1].anchors.mul_(2)  # as autoanchor does
        after = model(x)[0]
    assert torch.allclose(after[..., 2:4], 2 * before[..., 2:4]) and torch.equal(after[..., :2], before[..., :2])
