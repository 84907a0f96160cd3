"""ddp_utils.device on a machine without a GPU (the GPU paths run on the lent GPU machine)."""

from __future__ import annotations

import pytest
import torch

import ddp_utils as du
from ddp_utils.device import DeviceRequest, available_devices, parse_device

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


@pytest.mark.parametrize(
    ("text", "request_"),
    [
        ("", DeviceRequest("auto")),
        ("cpu", DeviceRequest("cpu")),
        (" CPU ", DeviceRequest("cpu")),
        ("mps", DeviceRequest("mps")),
        ("0", DeviceRequest("cuda", (0,))),
        ("0,1,2,3", DeviceRequest("cuda", (0, 1, 2, 3))),
        ("cuda:1", DeviceRequest("cuda", (1,))),
        ("cuda", DeviceRequest("cuda", (0,))),
        (2, DeviceRequest("cuda", (2,))),
        (torch.device("cuda", 3), DeviceRequest("cuda", (3,))),
    ],
)
def test_parse_device(text, request_):
    assert parse_device(text) == request_


@pytest.mark.parametrize("text", ["gpu", "0,,x", "cuda:a", "0,0", "-1"])
def test_parse_device_rejects_malformed(text):
    with pytest.raises(ValueError, match="device"):
        parse_device(text)


def test_select_cpu():
    assert du.select_device("cpu") == torch.device("cpu")
    assert du.select_device("cpu", batch_size=7) == torch.device("cpu")


@needs_no_gpu
def test_select_default_is_cpu_here():
    assert du.select_device("") == torch.device("cpu")


@needs_no_gpu
@pytest.mark.parametrize("text", ["0", "0,1", "cuda:1"])
def test_select_missing_gpu_lists_what_is_there(text):
    with pytest.raises(ValueError, match=r"CUDA is not available.*devices here: cpu"):
        du.select_device(text)


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="MPS is there")
def test_select_missing_mps():
    with pytest.raises(ValueError, match="MPS is not available"):
        du.select_device("mps")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_batch_size_must_divide_by_gpus():
    with pytest.raises(ValueError, match="does not divide"):
        du.select_device("0,1", batch_size=3)


def test_available_devices_starts_with_cpu():
    assert available_devices()[0] == "cpu"


def test_summary_logged_once(caplog, monkeypatch):
    import ddp_utils.device as device_module

    monkeypatch.setattr(device_module, "_summary_logged", False)
    logger = du.set_logging(rank=-1)
    logger.propagate = True
    try:
        with caplog.at_level("INFO", logger="ddp_utils"):
            du.select_device("cpu")
            du.select_device("cpu")
    finally:
        logger.propagate = False
    lines = [r.getMessage() for r in caplog.records if "torch" in r.getMessage()]
    assert len(lines) == 1 and torch.__version__ in lines[0]


def test_time_synchronized_is_monotonic_perf_counter():
    stamps = [du.time_synchronized() for _ in range(100)]
    assert stamps == sorted(stamps)
    assert stamps[-1] - stamps[0] < 1.0  # seconds, from perf_counter, not an epoch time
