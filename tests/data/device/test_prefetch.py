"""DevicePrefetcher: on CPU exactly the plain loop's batches; on CUDA (where present) the same values."""

from __future__ import annotations

import pytest
import torch

from ddp_utils.data.device.prefetch import DevicePrefetcher, to_device_batch
from ddp_utils.data.loader import create_dataloader
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
    from tests.hostwait import HostWaitCounter

    imgs = torch.randint(0, 256, (3, 3, 17, 9), dtype=torch.uint8)
    old = imgs.float() / 255
    if channels_last:
        old = old.contiguous(memory_format=torch.channels_last)
    with HostWaitCounter() as counter:
        new = images_to_float(imgs, channels_last)
    assert torch.equal(new, old) and new.stride() == old.stride() and new.dtype == torch.float32
    assert dict(counter.by_op) == {"empty": 1, "copy_": 1, "div_": 1}  # one allocation, written in place


# ---- the loader thread: the decode and the render off the training thread ----


@pytest.fixture
def eager_render(monkeypatch):
    # the fast tier compiles nothing: the process's CPU renderer runs its kernels eagerly (the same code)
    import ddp_utils.data.device.render as device_render

    monkeypatch.setattr(device_render, "_RENDERERS", {})
    device_render.renderer_for("cpu", compiled=False)


@pytest.fixture(scope="module")
def recipe_root(tmp_path_factory):
    return make_shapes_dataset(tmp_path_factory.mktemp("recipes") / "shapes", 12, 0, size=(64, 96))


def test_decode_and_render_run_on_the_loader_thread_and_the_training_thread_never_waits(
    recipe_root, eager_render, monkeypatch
):
    import threading

    import ddp_utils.data.device.render as device_render
    from ddp_utils.data.device.decode import jpeg_decoder
    from tests.hostwait import HostWaitCounter

    threads = {"decode": set(), "render": set()}
    decoder = jpeg_decoder("cpu")
    decode, render = decoder.decode, device_render.render_rows

    def decode_here(*args, **kwargs):
        threads["decode"].add(threading.current_thread().name)
        return decode(*args, **kwargs)

    def render_here(*args, **kwargs):
        threads["render"].add(threading.current_thread().name)
        return render(*args, **kwargs)

    monkeypatch.setattr(decoder, "decode", decode_here)
    monkeypatch.setattr(device_render, "render_rows", render_here)
    loader, _ = create_dataloader(
        recipe_root / "images" / "train", 64, 4, 32, hyp=HYP, augment=True, shuffle=True, seed=3, augment_on="device"
    )
    loader.set_epoch(0)
    prefetcher = DevicePrefetcher(loader, "cpu", channels_last=True)
    assert prefetcher.threaded  # a loader that sends recipes: a loader thread on the CPU too
    with HostWaitCounter() as counter:  # the training thread's ops, as the step's loop takes the batches
        batches = [imgs for imgs, *_ in prefetcher]
    assert len(batches) == len(loader) and all(imgs.dtype == torch.float32 for imgs in batches)
    assert counter.waits == [] and counter.ops == 0, (counter.waits, dict(counter.by_op))
    assert threads == {"decode": {"ddp_utils-loader"}, "render": {"ddp_utils-loader"}}


def test_the_loader_thread_raises_in_the_callers_thread_and_stops_when_closed():
    from ddp_utils.data.device.prefetch import LoaderThread

    def batches():
        yield 1
        raise RuntimeError("DataLoader worker died")

    thread = LoaderThread(batches(), lambda b: b, torch.device("cpu"))
    got = []
    with pytest.raises(RuntimeError, match="worker died"):
        for batch in thread:
            got.append(batch)
    thread.close()
    assert got == [1]

    taken = []

    def endless():
        for k in range(10**6):
            taken.append(k)
            yield k

    thread = LoaderThread(endless(), lambda b: b, torch.device("cpu"), ahead=2)
    first = next(iter(thread))
    import time

    time.sleep(0.3)  # the thread runs ahead as far as it may: one batch ready, one in the making
    assert first == 0 and len(taken) <= 4, taken
    thread.close()
    assert not thread._thread.is_alive()


def test_workers_persist_across_epochs_and_the_batches_are_the_unthreaded_ones(recipe_root, eager_render):
    # YOLOv5's InfiniteDataLoader keeps its workers; so does EpochLoader, through the loader thread too
    for augment_on in ("workers", "device"):
        kwargs = dict(hyp=HYP, augment=True, shuffle=True, seed=3, workers=2, augment_on=augment_on)
        threaded, _ = create_dataloader(recipe_root / "images" / "train", 64, 4, 32, **kwargs)
        plain, _ = create_dataloader(recipe_root / "images" / "train", 64, 4, 32, **kwargs)
        pids = []
        for epoch in range(3):
            for loader in (threaded, plain):
                loader.set_epoch(epoch)
            got = [b[0] for b in DevicePrefetcher(threaded, "cpu", threaded=True)]
            ref = [to_device_batch(b, torch.device("cpu"))[0] for b in plain]
            assert len(got) == len(ref) == len(plain) and all(map(torch.equal, got, ref)), (augment_on, epoch)
            pids.append(sorted(w.pid for w in threaded._iterator._workers))
        assert pids[0] == pids[1] == pids[2], (augment_on, pids)
        # a resume in the middle of an epoch: its last batches, the same ones
        threaded.set_epoch(1, start_batch=1)
        plain.set_epoch(1)
        tail = [b[0] for b in DevicePrefetcher(threaded, "cpu", threaded=True)]
        whole = [to_device_batch(b, torch.device("cpu"))[0] for b in plain]
        assert len(tail) == len(whole) - 1 and all(map(torch.equal, tail, whole[1:])), augment_on
