"""Batches through the reused shared-memory slots: the same images as without workers, never overwritten."""

from __future__ import annotations

import pytest
import torch

import ddp_utils.data.loader as loader_module
from ddp_utils.data.loader import create_dataloader
from ddp_utils.data.synthetic import make_shapes_dataset
from ddp_utils.data.transfer import BatchPool, SlotImages
from tests.workers.data_scenarios import HYP


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return (
        make_shapes_dataset(tmp_path_factory.mktemp("transfer") / "shapes", 20, 0, size=(96, 160)) / "images" / "train"
    )


@pytest.fixture
def pooled_batches(monkeypatch):
    """Counts the batches that came through a slot."""
    seen = []
    unpack = loader_module.unpack

    def counting(batch, pool, pin_memory=False):
        seen.append(isinstance(batch[0], SlotImages))
        return unpack(batch, pool, pin_memory)

    monkeypatch.setattr(loader_module, "unpack", counting)
    return seen


def epochs(loader, count):
    held = []
    for epoch in range(count):
        loader.set_epoch(epoch)
        held += [(imgs, targets, paths) for imgs, targets, paths, _ in loader]
    return held


@pytest.mark.parametrize("mode", ["mosaic", "rect", "quad"])
def test_slots_give_the_images_of_the_usual_way(images, pooled_batches, monkeypatch, mode):
    kw = dict(hyp=HYP, augment=mode != "rect", rect=mode == "rect", quad=mode == "quad", shuffle=mode != "rect")
    pooled, _ = create_dataloader(images, 64, 4, 32, workers=2, seed=3, **kw)
    # three epochs, every batch held to the end: slots are reused many times over meanwhile
    got = epochs(pooled, 3)
    assert len(got) == 15 and len(pooled_batches) == 15 and all(pooled_batches)
    # all copied out and freed, but for the next epoch's batches the workers prefetched meanwhile
    assert pooled._pool.free_slots >= len(pooled._pool.buffers) - 2 * pooled.num_workers
    pooled.close()
    assert pooled._pool is None

    monkeypatch.setattr(loader_module, "_batch_pool", lambda *args: None)
    usual, _ = create_dataloader(images, 64, 4, 32, workers=2, seed=3, **kw)
    references = [epochs(usual, 3)]
    if mode != "quad":  # quad's grid-or-upsample draw is seeded per worker: not the same without workers
        references.append(epochs(create_dataloader(images, 64, 4, 32, workers=0, seed=3, **kw)[0], 3))
    assert not any(pooled_batches[15:])
    for reference in references:
        for (im_a, t_a, p_a), (im_b, t_b, p_b) in zip(got, reference, strict=True):
            assert p_a == p_b and torch.equal(t_a, t_b)
            assert torch.equal(im_a, im_b)


def test_restart_frees_the_slots_of_abandoned_batches(images, pooled_batches):
    loader, _ = create_dataloader(images, 64, 4, 32, hyp=HYP, augment=True, shuffle=True, workers=2)
    loader.set_epoch(0)
    for _ in zip(range(2), loader):  # the workers hold prefetched batches in slots
        pass
    assert loader._pool.free_slots < len(loader._pool.buffers)
    full = epochs(loader, 1)  # a restart at epoch 0
    assert len(full) == 5 and all(pooled_batches)
    assert loader._pool.free_slots >= len(loader._pool.buffers) - 2 * loader.num_workers


def test_batches_without_a_slot_travel_the_usual_way():
    pool = BatchPool(slots=1, slot_bytes=3 * 4 * 4 * 2)
    batch = torch.randint(0, 255, (2, 3, 4, 4), dtype=torch.uint8)
    slot = pool.acquire()
    assert slot == 0 and pool.acquire() == -1  # all taken: the next batch gets none
    assert pool.put(-1, batch) is batch
    assert pool.put(slot, torch.cat([batch, batch])) is not None  # too big for the slot
    assert isinstance(pool.put(slot, torch.cat([batch, batch])), torch.Tensor)
    assert pool.put(slot, batch.float()) is not None and not isinstance(pool.put(slot, batch.float()), SlotImages)
    ref = pool.put(slot, batch)
    assert isinstance(ref, SlotImages)
    out = pool.take(ref)
    assert torch.equal(out, batch) and pool.free_slots == 1
    pool.buffers[0].zero_()  # the copy is the caller's own
    assert torch.equal(out, batch)


def test_no_pool_when_shared_memory_is_short(images, pooled_batches, monkeypatch):
    monkeypatch.setattr(loader_module, "disk_free", lambda path: 100_000)  # less than 6 slots of 4 x 3 x 64 x 64
    loader, _ = create_dataloader(images, 64, 4, 32, hyp=HYP, augment=True, shuffle=True, workers=2)
    assert len(epochs(loader, 1)) == 5
    assert loader._pool is None and not any(pooled_batches)


@pytest.mark.parametrize("takes_out", [True, False])
def test_collate_fills_the_slot_and_sends_small_tensors_inline(takes_out):
    from ddp_utils.data.dataset import stack_images
    from ddp_utils.data.transfer import InlineArray, PooledCollate, unpack

    def collate_with_out(samples, out=None):
        return stack_images([s[0] for s in samples], out), torch.stack([s[1] for s in samples]), "paths"

    def collate(samples):
        return collate_with_out(samples)

    pool = BatchPool(slots=2, slot_bytes=3 * 4 * 4 * 3)
    samples = [(torch.full((3, 4, 4), k, dtype=torch.uint8), torch.tensor([k, 0.5])) for k in range(3)]
    sent = PooledCollate(collate_with_out if takes_out else collate, pool)((pool.acquire(), samples))
    assert isinstance(sent[0], SlotImages) and isinstance(sent[1], InlineArray) and sent[2] == "paths"
    assert pool.buffers[0][: 3 * 4 * 4 * 3].view(3, 3, 4, 4)[:, 0, 0, 0].tolist() == [0, 1, 2]
    images, labels, paths = unpack(sent, pool)
    assert torch.equal(images, torch.stack([s[0] for s in samples]))
    assert torch.equal(labels, torch.tensor([[0, 0.5], [1, 0.5], [2, 0.5]]))
    assert pool.free_slots == 2


def test_a_batch_larger_than_the_dataset_gets_slots_for_the_dataset_only(images, monkeypatch):
    """``--batch-size 100000`` on 20 images: every batch holds the 20; the slots were sized for 100,000 (2.76 GB each
    at 96 px, made and page-faulted at every start of the workers: 1.1 img/s)."""
    made = []
    monkeypatch.setattr(loader_module, "BatchPool", lambda slots, nbytes: made.append((slots, nbytes)) or "pool")
    loader, dataset = create_dataloader(images, 64, 100_000, 32, hyp=HYP, augment=True, shuffle=True, workers=1)
    assert loader_module._batch_pool(dataset, 100_000, 1, 2) == "pool"
    assert made == [(1 * 2 + 2, 3 * 64 * 64 * len(dataset))] and len(dataset) == 20


def test_no_pool_past_what_this_process_can_take(images, pooled_batches, monkeypatch):
    """``ulimit -v`` (or a cgroup's limit) with room for less than twice the pool: the batches go torch's way."""
    monkeypatch.setattr(loader_module, "memory_room", lambda: (100_000, "its address-space limit, ulimit -v"))
    loader, _ = create_dataloader(images, 64, 4, 32, hyp=HYP, augment=True, shuffle=True, workers=2)
    assert len(epochs(loader, 1)) == 5
    assert loader._pool is None and not any(pooled_batches)


LEAK = """
import os, resource, sys
import torch
from ddp_utils.data.transfer import BatchPool
slot = 2**30
mapped = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (mapped + 3 * slot // 2, resource.RLIM_INFINITY))
try:  # torch's empty() of the slot fits, its shared copy's mmap does not
    BatchPool(1, slot)
except RuntimeError as exc:
    print("refused:", str(exc).splitlines()[0])
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_shared_slot_that_cannot_be_mapped_leaves_no_file_in_dev_shm():
    """torch sizes /dev/shm/torch_<pid>_... before it maps it and unlinks it only once mapped: under ``ulimit -v``
    the map failed and a file as large as the slot stayed after the process exited 0 (2.76 GB, twice)."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.multiproc import REPO_ROOT, launcher_env

    proc = subprocess.Popen([sys.executable, "-c", LEAK], cwd=REPO_ROOT, env=launcher_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    out, err = proc.communicate(timeout=100)
    left = sorted(Path("/dev/shm").glob(f"torch_{proc.pid}_*"))
    for path in left:  # the test's own leftover, if any
        path.unlink()
    assert proc.returncode == 0 and "refused: unable to mmap" in out, out + err
    assert left == []
