"""DevicePrefetcher: on CPU exactly the plain loop's batches; on CUDA (where present) the same values."""

from __future__ import annotations

import pytest
import torch

from ddp_utils.data.loader import create_dataloader
from ddp_utils.data.prefetch import DevicePrefetcher, to_device_batch
from ddp_utils.data.synthetic import make_shapes_dataset
from tests.workers.data_scenarios import HYP


@pytest.fixture(scope="module")
def loader(tmp_path_factory):
    root = make_shapes_dataset(tmp_path_factory.mktemp("prefetch") / "shapes", 12, 2, size=(96, 160))
    loader, _ = create_dataloader(root / "images" / "train", 64, 4, 32, hyp=HYP, augment=True, shuffle=True, seed=3)
    return loader


def plain_epoch(loader, device: torch.device, epoch: int) -> list[tuple]:
    """What train.py's loop computes per batch without a prefetcher."""
    loader.set_epoch(epoch)
    return [
        (imgs.to(device, non_blocking=True).float() / 255, targets.to(device), paths, shapes)
        for imgs, targets, paths, shapes in loader
    ]


def assert_same_batches(got: list[tuple], expected: list[tuple]) -> None:
    assert len(got) == len(expected)
    for (imgs, targets, paths, shapes), (imgs_ref, targets_ref, paths_ref, shapes_ref) in zip(got, expected):
        assert imgs.dtype == imgs_ref.dtype and imgs.device == imgs_ref.device
        assert torch.equal(imgs, imgs_ref) and torch.equal(targets, targets_ref)
        assert list(paths) == list(paths_ref) and shapes == shapes_ref


def test_cpu_prefetcher_yields_exactly_the_plain_path(loader):
    cpu = torch.device("cpu")
    expected = plain_epoch(loader, cpu, 0)
    loader.set_epoch(0)
    prefetcher = DevicePrefetcher(loader, cpu)
    assert len(prefetcher) == len(loader) == 3
    got = list(prefetcher)
    assert_same_batches(got, expected)
    assert all(imgs.is_contiguous() for imgs, *_ in got)


def test_channels_last_on_cpu_keeps_the_values(loader):
    cpu = torch.device("cpu")
    expected = plain_epoch(loader, cpu, 1)
    loader.set_epoch(1)
    got = list(DevicePrefetcher(loader, cpu, channels_last=True))
    assert all(imgs.is_contiguous(memory_format=torch.channels_last) for imgs, *_ in got)
    assert_same_batches(got, expected)


def test_float_images_and_short_batches_pass_through():
    images = torch.rand(2, 3, 4, 4)
    out = to_device_batch((images, torch.ones(1, 6)), torch.device("cpu"))
    assert out[0] is images and len(out) == 2
    assert list(DevicePrefetcher([], "cpu")) == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_prefetcher_gives_the_plain_path_values(loader):
    cuda = torch.device("cuda", torch.cuda.current_device())
    expected = plain_epoch(loader, cuda, 2)
    loader.set_epoch(2)
    got = []
    for imgs, targets, paths, shapes in DevicePrefetcher(loader, cuda, channels_last=True):
        assert imgs.is_contiguous(memory_format=torch.channels_last)
        got.append((imgs * 1, targets.clone(), paths, shapes))  # used on the compute stream, as a step would
    torch.cuda.synchronize()
    assert_same_batches(got, expected)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_prefetcher_reserves_no_more_memory_epoch_after_epoch():
    # a new side stream per epoch left each epoch's batch-sized blocks cached for a stream nobody used again:
    # the reserved memory grew by a few batches an epoch (+1 G an epoch at yolov5s, 640 px, batch 64)
    cuda = torch.device("cuda", torch.cuda.current_device())
    batches = [(torch.zeros(8, 3, 256, 256, dtype=torch.uint8), torch.zeros(4, 6)) for _ in range(4)]
    reserved = []
    for _epoch in range(6):
        for imgs, _targets in DevicePrefetcher(batches, cuda):
            (imgs * 2).sum()  # used on the compute stream, as a step would
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved(cuda))
    assert reserved[-1] == reserved[1], [f"{r / 2**20:.0f} MiB" for r in reserved]


@pytest.mark.parametrize("channels_last", [False, True])
def test_images_to_float_is_one_allocation_with_the_old_values(channels_last):
    from ddp_utils.data import images_to_float

    from ..hostwait import HostWaitCounter

    imgs = torch.randint(0, 256, (3, 3, 17, 9), dtype=torch.uint8)
    old = imgs.float() / 255
    if channels_last:
        old = old.contiguous(memory_format=torch.channels_last)
    with HostWaitCounter() as counter:
        new = images_to_float(imgs, channels_last)
    assert torch.equal(new, old) and new.stride() == old.stride() and new.dtype == torch.float32
    assert dict(counter.by_op) == {"empty": 1, "copy_": 1, "div_": 1}  # one allocation, written in place
