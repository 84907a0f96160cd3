"""ddp_utils.device on a machine without a GPU (the GPU paths run on the lent GPU machine)."""

from __future__ import annotations

import logging
import os

import pytest
import torch

import ddp_utils as du
from ddp_utils.device import DeviceError, DeviceRequest, available_devices, parse_device, select_device

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


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_batch_size_must_divide_by_gpus():
    with pytest.raises(ValueError, match="does not divide"):
        du.select_device("0,1", batch_size=3)


def test_available_devices_starts_with_cpu():
    assert available_devices()[0] == "cpu"


def test_summary_logged_once(monkeypatch):
    import ddp_utils.device as device_module

    monkeypatch.setattr(device_module, "_summary_logged", False)
    du.set_logging(rank=-1)
    # a handler of our own on the library's logger: what other tests left on the root logger does not count
    collected = _Collect(logging.INFO)
    du.LOGGER.addHandler(collected)
    try:
        du.select_device("cpu")
        du.select_device("cpu")
    finally:
        du.LOGGER.removeHandler(collected)
    lines = [m for m in collected.messages if "torch" in m]
    assert len(lines) == 1 and torch.__version__ in lines[0]


class _Collect(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def one_gpu_per_node_of_two(monkeypatch):
    """This process is local rank 1 of 2 under torchrun on a node that seems to have one GPU."""
    import ddp_utils.device as device_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(device_module, "_summary_logged", True)  # the banner would ask the absent GPU its name
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")  # both undone at teardown, whatever select_device sets
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "1"}
    for name, value in {**env, "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


@pytest.mark.parametrize("text", ["0", "", "cuda:0"])
def test_more_local_processes_than_gpus_is_one_error_naming_the_counts(one_gpu_per_node_of_two, text):
    with pytest.raises(ValueError) as failure:
        du.select_device(text)
    message = str(failure.value)
    assert message.startswith("2 processes on this node (LOCAL_WORLD_SIZE=2, this is local rank 1)")
    assert "gives 1 GPU(s) of the 1 visible" in message and "--nproc_per_node 1" in message
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # refused before touching anything


def test_every_local_rank_gets_the_same_count_error(one_gpu_per_node_of_two):
    one_gpu_per_node_of_two.setenv("RANK", "0")
    one_gpu_per_node_of_two.setenv("LOCAL_RANK", "0")  # its GPU exists, but the job cannot run
    with pytest.raises(ValueError, match="2 processes on this node .* gives 1 GPU"):
        du.select_device("0")


def test_gpu_list_becomes_visible_devices_and_each_rank_takes_its_own(one_gpu_per_node_of_two):
    one_gpu_per_node_of_two.setattr(torch.cuda, "device_count", lambda: 2)
    warnings = _Collect(logging.WARNING)
    du.LOGGER.addHandler(warnings)
    try:
        assert du.select_device("0,1", batch_size=4) == torch.device("cuda", 1)
        du.LOGGER.warning("the collector works")
    finally:
        du.LOGGER.removeHandler(warnings)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert warnings.messages == ["the collector works"]  # a correct request: no warning of its own
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        one_gpu_per_node_of_two.delenv(name)
    assert du.select_device("0,1") == torch.device("cuda", 0)  # a single process, as in YOLOv5


def test_cpu_request_where_cuda_is_stays_on_the_cpu(one_gpu_per_node_of_two):
    assert du.select_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU, so cuda:0 is there")
def test_a_missing_gpu_is_an_assertion_error_as_in_yolov5_and_a_value_error_as_ours():
    with pytest.raises(AssertionError) as info:  # how a YOLOv5 user guards select_device
        select_device("0")
    assert isinstance(info.value, ValueError) and isinstance(info.value, DeviceError)
    assert "CUDA is not available" in str(info.value) and "--device cpu" in str(info.value)
