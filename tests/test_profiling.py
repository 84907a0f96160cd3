"""Tests of ddp_utils.profiling (model_info, flops, profile) and the profile command (python -m ddp_utils profile)."""

from __future__ import annotations

import builtins
import json
import logging
import subprocess
import sys
import time

import pytest
import torch
import torch.nn as nn

from ddp_utils.cli.profile import main as profile_main
from ddp_utils.profiling import flops, format_table, gather_rows, model_info, parse_devices, profile
from tests.multiproc import REPO_ROOT, collect, describe, free_port, launch, launcher_env

CUDA = torch.cuda.is_available()


class MatmulBlock(nn.Module):
    """A layer thop has no rule for: its own weight, multiplied in its own forward."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features, features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


def conv_macs(batch, c_in, c_out, k, h_out, w_out, groups=1):
    return batch * c_out * h_out * w_out * (c_in // groups) * k * k


@pytest.mark.parametrize(
    ("conv", "imgsz", "batch", "macs"),
    [
        (nn.Conv2d(3, 8, 3, padding=1), 8, 1, conv_macs(1, 3, 8, 3, 8, 8)),
        (nn.Conv2d(3, 8, 3, padding=1, bias=False), (10, 12), 2, conv_macs(2, 3, 8, 3, 10, 12)),
        (nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), 16, 1, conv_macs(1, 4, 6, 3, 8, 8, groups=2)),
    ],
)
def test_flops_of_conv2d_by_hand(conv, imgsz, batch, macs):
    report = flops(conv, imgsz=imgsz, batch=batch)
    # both conventions give 2 FLOPs per multiply-add of a conv (bias not counted)
    assert report.thop_gflops * 1e9 == pytest.approx(2 * macs)
    assert report.torch_gflops * 1e9 == pytest.approx(2 * macs)
    assert report.counter == "thop" and report.gflops == report.thop_gflops
    h, w = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
    assert report.input_shape == (batch, conv.in_channels, h, w)
    assert report.thop_uncounted == [] and report.notes == []


def test_flops_of_linear_by_hand():
    report = flops(nn.Linear(16, 4), inputs=torch.randn(5, 16))
    assert report.thop_gflops * 1e9 == pytest.approx(2 * 5 * 4 * 16)
    assert report.torch_gflops * 1e9 == pytest.approx(2 * 5 * 4 * 16)
    assert report.input_shape == (5, 16)
    # without an explicit input, a Linear first layer gets vectors, not images
    assert flops(nn.Linear(16, 4), batch=3).input_shape == (3, 16)


def test_report_text_names_both_conventions():
    text = flops(nn.Conv2d(3, 4, 1), imgsz=4).text()
    assert "2 x MACs" in text and "thop" in text and "FlopCounterMode" in text and "(1, 3, 4, 4)" in text


def test_module_thop_cannot_count_is_named():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 6), MatmulBlock(6))
    report = flops(model, inputs=torch.randn(2, 3, 2, 2))
    linear, matmul = 2 * 2 * 6 * 12, 2 * 2 * 6 * 6
    assert report.thop_gflops * 1e9 == pytest.approx(linear)  # thop skips the block
    assert report.torch_gflops * 1e9 == pytest.approx(linear + matmul)  # the aten mm is counted
    assert report.thop_uncounted == ["2 (MatmulBlock)"]
    assert "2 (MatmulBlock)" in report.text()


class Looped(nn.Module):
    """Runs its layers from a ModuleList itself, as a yaml-built detector does: the list's forward never runs."""

    def __init__(self, last: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 1), nn.Flatten(), last])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_containers_whose_forward_never_ran_are_not_named():
    assert flops(Looped(nn.Identity()), imgsz=2).thop_uncounted == []
    assert flops(Looped(MatmulBlock(16)), imgsz=2).thop_uncounted == ["layers.3 (MatmulBlock)"]


def test_op_flopcountermode_cannot_count_is_named(caplog):
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        report = flops(nn.Bilinear(4, 4, 2), inputs=(torch.randn(3, 4), torch.randn(3, 4)))
    assert "aten._trilinear" in report.torch_uncounted
    assert any("Bilinear" in name for name in report.thop_uncounted)
    assert "counted 0 FLOPs" in caplog.text  # a zero count is never silent


def _refuse_thop_import(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "thop" or name.startswith("thop."):
            raise ModuleNotFoundError("No module named 'thop'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)


@pytest.mark.parametrize("how", ["sys.modules", "__import__"])
def test_without_thop_flopcountermode_serves(monkeypatch, caplog, how):
    for name in [m for m in sys.modules if m == "thop" or m.startswith("thop.")]:
        monkeypatch.delitem(sys.modules, name)
    if how == "sys.modules":
        monkeypatch.setitem(sys.modules, "thop", None)  # makes `import thop` raise ImportError
    else:
        _refuse_thop_import(monkeypatch)
    conv = nn.Conv2d(3, 8, 3, padding=1)
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        report = flops(conv, imgsz=8)
    assert report.thop_gflops is None
    assert report.counter == "FlopCounterMode"
    assert report.gflops * 1e9 == pytest.approx(2 * conv_macs(1, 3, 8, 3, 8, 8))
    assert any("thop is not installed" in note for note in report.notes)
    assert "FlopCounterMode's count serves" in report.text() and "thop is not installed" in caplog.text
    info = model_info(conv, imgsz=8)
    assert info["counter"] == "FlopCounterMode" and "(FlopCounterMode)" in info["summary"]


def test_model_keeps_mode_device_and_buffers():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)))
    model.train()
    model[2].eval()  # a frozen part: mixed modes must survive too
    modes = [m.training for m in model.modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    flops(model, imgsz=16)
    model_info(model, imgsz=16)
    assert [m.training for m in model.modules()] == modes
    assert not any("total_ops" in name or "total_params" in name for name, _ in model.named_buffers())
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())  # BN stats untouched
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_model_info_counts(caplog):
    model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    model[0].weight.requires_grad_(False)
    with caplog.at_level(logging.INFO, logger="ddp_utils"):
        info = model_info(model, imgsz=8, verbose=True)
    conv, bn, linear = 4 * 3 * 3 * 3, 2 * 4, 4 * 6 * 6 * 5 + 5
    assert info["layers"] == 5  # the Sequential and its four layers
    assert info["parameters"] == conv + bn + linear
    assert info["gradients"] == bn + linear
    assert info["gflops"] == pytest.approx(flops(model, imgsz=8).gflops)
    assert info["counter"] == "thop"
    assert info["summary"].startswith(
        f"Sequential summary: 5 layers, {conv + bn + linear} parameters, {bn + linear} gradients"
    )
    assert info["summary"] in caplog.text
    for name, _ in model.named_parameters():
        assert name in caplog.text  # the per-parameter table


def test_model_info_survives_an_uncountable_model(caplog):
    class NeedsTwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))

        def forward(self, x, y):
            return x * y * self.scale

    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        info = model_info(NeedsTwoInputs(), imgsz=8)
    assert info["parameters"] == 1 and info["gflops"] is None
    assert "GFLOPs not counted" in caplog.text
    assert info["summary"] == "NeedsTwoInputs summary: 1 layers, 1 parameters, 1 gradients"  # as YOLOv5: no GFLOPs part


COLUMNS = {
    "op",
    "device",
    "parameters",
    "gflops",
    "flops_counter",
    "memory_gb",
    "forward_ms",
    "backward_ms",
    "input_shape",
    "output_shape",
    "error",
}


def test_profile_on_cpu_rows():
    conv = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.SiLU())
    rows = profile([16, torch.rand(3, 2, 8, 8)], [conv, nn.SiLU(), torch.sigmoid], n=3, device="cpu")
    assert len(rows) == 3 * 2
    for row in rows:
        assert set(row) == COLUMNS
        assert row["device"] == "cpu" and row["error"] is None and row["forward_ms"] > 0
        assert row["memory_gb"] is None  # not measured on the CPU, and said so in the table
    by_op = {(r["op"], r["input_shape"]): r for r in rows}
    first = by_op[("Sequential", (1, 2, 16, 16))]  # the int size took the conv's 2 input channels
    assert first["output_shape"] == (1, 4, 16, 16)
    assert first["parameters"] == 2 * 4 * 9 + 4
    assert first["backward_ms"] > 0 and first["flops_counter"] == "thop"
    assert first["gflops"] * 1e9 == pytest.approx(2 * conv_macs(1, 2, 4, 3, 16, 16))
    silu = by_op[("SiLU", (3, 2, 8, 8))]
    assert silu["parameters"] == 0 and silu["backward_ms"] is None and silu["output_shape"] == (3, 2, 8, 8)
    assert by_op[("sigmoid", (3, 2, 8, 8))]["flops_counter"] == "FlopCounterMode"
    table = format_table(rows)
    assert table.splitlines()[0].split()[:3] == ["op", "device", "params"]
    assert "not measured on cpu" in table and "2 x MACs" in table


def test_profile_leaves_the_op_alone():
    linear = nn.Linear(4, 2)
    before = linear.weight.detach().clone()
    profile(torch.rand(2, 4), linear, n=2, device="cpu")
    assert linear.weight.grad is None and torch.equal(linear.weight, before)


def test_profile_input_with_grad_gets_a_backward():
    x = torch.rand(2, 8, requires_grad=True)
    (row,) = profile(x, torch.tanh, n=2, device="cpu")
    assert row["backward_ms"] > 0 and row["gflops"] == 0


@pytest.mark.parametrize("device", ["cpu,cpu", ["cpu", "cpu"]])
def test_profile_device_list_gives_a_row_each(device):
    rows = profile(torch.rand(1, 4), nn.Linear(4, 3), n=2, device=device)
    assert [r["device"] for r in rows] == ["cpu", "cpu"]
    assert rows[0]["gflops"] == rows[1]["gflops"] and all(r["forward_ms"] > 0 for r in rows)


def test_profile_failing_op_is_a_visible_error_row(caplog):
    def broken(x):
        raise RuntimeError("out of memory, pretend")

    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        rows = profile(torch.rand(2, 2), [broken, nn.Identity()], n=1, device="cpu")
    assert "out of memory, pretend" in rows[0]["error"] and rows[0]["forward_ms"] is None
    assert rows[1]["error"] is None
    assert "out of memory, pretend" in caplog.text and "error: broken on cpu" in format_table(rows)


@pytest.mark.parametrize(
    ("device", "message"),
    [("cuda:7" if not CUDA else "cuda:99", "is not there; devices here: cpu"), ("banana", "is not valid"), (",", "no")],
)
def test_bad_device_is_a_clear_error(device, message):
    with pytest.raises(ValueError, match=message):
        parse_devices(device)
    with pytest.raises(ValueError, match=message):
        profile(torch.rand(1, 2), nn.Linear(2, 2), device=device)


def test_bad_profile_args_are_clear_errors():
    with pytest.raises(ValueError, match="n=0"):
        profile(torch.rand(1, 2), nn.Linear(2, 2), n=0, device="cpu")
    with pytest.raises(ValueError, match="input 'img'"):
        profile("img", nn.Linear(2, 2), device="cpu")
    with pytest.raises(ValueError, match="imgsz"):
        flops(nn.Conv2d(3, 3, 1), imgsz=(0, 4))


def test_gather_rows_single_process():
    assert gather_rows([{"op": "x"}, {"op": "y"}]) == [{"rank": -1, "op": "x"}, {"rank": -1, "op": "y"}]


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_profile_cpu_and_gpu_in_one_table():
    rows = profile(torch.rand(4, 64), nn.Sequential(nn.Linear(64, 256), nn.ReLU()), n=3, device="cpu,0")
    assert [r["device"] for r in rows] == ["cpu", "cuda:0"]
    assert rows[0]["memory_gb"] is None and rows[1]["memory_gb"] > 0
    half = profile(torch.rand(4, 64), nn.Linear(64, 8).half(), n=2, device="0")[0]
    assert half["error"] is None and half["output_shape"] == (4, 8)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cli_torchvision_prints_both_tables():
    import torchvision

    expected = sum(p.numel() for p in torchvision.models.resnet18(weights=None).parameters())
    cmd = [sys.executable, "-m", "ddp_utils", "profile", "--torchvision", "resnet18", "--imgsz", "64"]
    cmd += ["--device", "cpu", "--n", "2"]
    env = launcher_env()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"ResNet summary: 68 layers, {expected} parameters, {expected} gradients" in out
    assert "thop" in out and "FlopCounterMode" in out and "(1, 3, 64, 64)" in out
    table = out[out.index("forward/backward of ResNet (train mode)") :].splitlines()
    assert table[1].split()[:4] == ["op", "device", "params", "GFLOPs"]
    assert table[2].split()[:3] == ["ResNet", "cpu", str(expected)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--torchvision", "resnet19"], "did you mean resnet18"),
        (["--torchvision", "resnet18", "--device", "7"], "device '7' in '7' is not there"),
        (["--torchvision", "resnet18", "--device", "cpu", "--half"], "--half needs CUDA devices"),
    ],
)
def test_cli_bad_values_are_clear_errors(argv, message, capsys):
    assert profile_main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "one of the arguments --cfg --torchvision is required"),
        (["--torchvision", "resnet18", "--imgsz", "0"], "--imgsz 0"),
        (["--torchvision", "resnet18", "--imgsz", "1", "2", "3"], "--imgsz 1 2 3"),
        (["--torchvision", "resnet18", "--n", "0"], "--repeats/--n 0"),
        (["--torchvision", "resnet18", "--batch-size", "0"], "--batch-size 0"),
    ],
)
def test_cli_bad_args_are_clear_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        profile_main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_two_ranks_gather_rows_on_every_rank_rank0_prints():
    workers = launch("tests.workers.profile_scenarios:gathered_rows", nprocs=2, timeout=75)
    assert all(w.returncode == 0 for w in workers), describe(workers)
    assert workers[1].stdout.strip() == "", describe(workers)
    rows = json.loads(workers[0].stdout.strip().splitlines()[-1])
    assert [(r["rank"], r["output_shape"]) for r in rows] == [(0, [2, 4]), (1, [2, 8])]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_torchrun_cli_one_row_per_rank_printed_by_rank0():
    port = free_port()
    env = launcher_env()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
    cmd += ["--master_port", str(port), "-m", "ddp_utils", "profile", "--torchvision", "resnet18", "--imgsz", "32"]
    cmd += ["--device", "cpu", "--repeats", "2"]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    (run,) = collect([proc], start, 140, "torchrun -m ddp_utils profile")
    assert run.returncode == 0, describe([run])
    assert run.stdout.count("ResNet summary:") == 1  # rank 0 alone prints
    table = run.stdout[run.stdout.index("forward/backward of ResNet") :].splitlines()
    assert table[1].split()[:3] == ["rank", "op", "device"]
    assert [line.split()[:3] for line in table[2:4]] == [["0", "ResNet", "cpu"], ["1", "ResNet", "cpu"]]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cli_profiles_the_detector_from_its_yaml():
    cmd = [sys.executable, "-m", "ddp_utils", "profile", "--cfg", "yolov5n.yaml", "--imgsz", "64", "--device", "cpu"]
    cmd += ["--n", "1"]
    env = launcher_env()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # the exact yolov5n architecture, and 3 detection levels at strides 8, 16, 32
    assert "YOLOv5n summary: 214 layers, 1872157 parameters, 1872157 gradients, 0.046 GFLOPs at 64x64" in proc.stdout
    assert "(1, 3, 8, 8, 85), (1, 3, 4, 4, 85), (1, 3, 2, 2, 85)" in proc.stdout


# YOLOv5 v7.0 prints these for the same architectures (train.py at model build; val.py and
# detect.py after "Fusing layers...", on a checkpoint whose parameters require no grad):
#   YOLOv5s summary: 214 layers, 7235389 parameters, 7235389 gradients, 16.6 GFLOPs
#   YOLOv5s summary: 157 layers, 7225885 parameters, 0 gradients, 16.4 GFLOPs
#   YOLOv5n summary: 214 layers, 1872157 parameters, 1872157 gradients, 4.6 GFLOPs
#   YOLOv5n summary: 157 layers, 1867405 parameters, 0 gradients, 4.5 GFLOPs
# Its layers are len(list(model.modules())): v7.0's Conv shares one SiLU object among all Convs
# (v6.x gave each Conv its own: "270 layers" unfused, "213 layers" fused), and its fuse deletes
# each Conv's batch norm (57 Convs in either size).
YOLOV5_SUMMARY = {
    "yolov5s": ((7235389, 16.6), (7225885, 16.4)),
    "yolov5n": ((1872157, 4.6), (1867405, 4.5)),
}


@pytest.mark.slow
@pytest.mark.parametrize("size", ["yolov5s", "yolov5n"])
def test_model_info_prints_yolov5s_summary_before_and_after_fuse(size, caplog):
    from ddp_utils.yolo.model import Model

    (params, gflops), (fused_params, fused_gflops) = YOLOV5_SUMMARY[size]
    layers, fused_layers = 214, 157  # YOLOv5 v7.0's, whose Convs share one activation object as ours do
    name = size.replace("yolov5", "YOLOv5")
    model = Model(f"{size}.yaml")
    with caplog.at_level(logging.INFO, logger="ddp_utils"):
        info = model_info(model)
    expected = f"{name} summary: {layers} layers, {params} parameters, {params} gradients, {gflops} GFLOPs"
    assert info["summary"] == expected and expected in caplog.text
    assert (info["name"], info["layers"], info["parameters"], info["counter"]) == (name, layers, params, "thop")

    model.fuse()  # fused convs are frozen, as YOLOv5's: "0 gradients"
    model.requires_grad_(False)  # the Detect head's convs are not fused; YOLOv5's released weights need no grad
    info = model_info(model)
    assert (
        info["summary"]
        == f"{name} summary: {fused_layers} layers, {fused_params} parameters, 0 gradients, {fused_gflops} GFLOPs"
    )


def test_detector_gflops_counted_at_its_stride_scale_exactly():
    from ddp_utils.profiling import model_gflops
    from ddp_utils.yolo.model import Model, load_model_yaml

    cfg = {**load_model_yaml("yolov5n.yaml")[0], "width_multiple": 0.0625}
    model = Model(cfg)
    gflops, counter = model_gflops(model, (64, 96))  # counted on 32 x 32, scaled by area
    assert counter == "thop" and gflops == pytest.approx(flops(model, (64, 96)).gflops, rel=1e-9)
    assert model_info(model, imgsz=(64, 96))["name"] == "Model"  # built from a dict: no yaml file to name it


def test_a_layer_stride_is_not_a_detector_stride():
    conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)  # Conv2d.stride is a tuple: counted at the size asked
    assert model_info(conv, imgsz=8)["gflops"] == pytest.approx(flops(conv, imgsz=8).gflops)
    assert model_info(conv, imgsz=8)["summary"].endswith("GFLOPs at 8x8")


@pytest.mark.parametrize(
    ("device", "message"),
    [(["0,1"], "is not valid"), ("cpu,gpu", "'gpu' in 'cpu,gpu' is not valid"), ("cuda:x", "is not valid")],
)
def test_parse_devices_reads_each_name_with_device_parse_device(device, message):
    with pytest.raises(ValueError, match=message):
        parse_devices(device)


def test_parse_devices_names_as_device_parse_device_does():
    assert parse_devices(" CPU , cpu") == [torch.device("cpu")] * 2
    assert parse_devices(torch.device("cpu")) == [torch.device("cpu")]
    assert parse_devices(None) == [torch.device("cuda", 0) if CUDA else torch.device("cpu")]


def test_top_level_profile_is_the_function():
    import ddp_utils
    import ddp_utils.profiling

    assert ddp_utils.profile is ddp_utils.profiling.profile and callable(ddp_utils.profile)
    assert "profile" in ddp_utils.__all__
    assert not (REPO_ROOT / "ddp_utils" / "profile.py").exists()  # the command line moved to ddp_utils.cli


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cli_module_help():
    cmd = [sys.executable, "-m", "ddp_utils", "profile", "--help"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=launcher_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m ddp_utils profile") and "--torchvision" in proc.stdout
