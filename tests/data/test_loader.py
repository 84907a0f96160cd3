"""create_dataloader end to end: one process with and without workers, and 2-process gloo groups."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from ddp_utils.data.loader import create_dataloader, create_val_dataloader
from ddp_utils.data.samplers import EvalSampler, TrainSampler
from ddp_utils.data.synthetic import make_shapes_dataset
from tests.multiproc import REPO_ROOT, describe, launch, records
from tests.workers.data_scenarios import HYP


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_shapes_dataset(tmp_path_factory.mktemp("loader") / "shapes", 24, 10, size=(96, 160))


def run_epoch(loader, epoch):
    loader.set_epoch(epoch)
    return [(list(paths), targets.clone()) for _imgs, targets, paths, _ in loader]


def flat_paths(batches):
    return [p for paths, _ in batches for p in paths]


def test_single_process_end_to_end(root):
    loader, dataset = create_dataloader(root / "images" / "train", 64, 5, 32, hyp=HYP, augment=True, shuffle=True)
    assert len(dataset) == 24 and len(loader) == 5
    assert dataset.label_cache_written or dataset.label_cache_loaded
    imgs, targets, paths, shapes = next(iter(loader))
    assert imgs.shape == (5, 3, 64, 64) and imgs.dtype == torch.uint8
    assert targets.shape[1] == 6 and set(targets[:, 0].long().tolist()) <= set(range(5))
    epoch1 = run_epoch(loader, 1)
    assert sorted(flat_paths(epoch1)) == sorted(dataset.im_files)  # every image once per epoch


def test_worker_count_does_not_change_the_data(root):
    kw = dict(hyp=HYP, augment=True, shuffle=True, seed=7)
    serial, _ = create_dataloader(root / "images" / "train", 64, 4, 32, workers=0, **kw)
    parallel, _ = create_dataloader(root / "images" / "train", 64, 4, 32, workers=2, **kw)
    assert parallel.num_workers == 2
    for epoch in (0, 1):
        a, b = run_epoch(serial, epoch), run_epoch(parallel, epoch)
        assert [p for p, _ in a] == [p for p, _ in b]
        assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b))


def test_epochs_reshuffle_without_replaying_prefetched_batches(root):
    kw = dict(hyp=HYP, augment=True, shuffle=True, seed=1, workers=2)
    loader, _ = create_dataloader(root / "images" / "train", 64, 4, 32, **kw)
    epoch0 = run_epoch(loader, 0)
    iterator = loader._iterator
    epoch1 = run_epoch(loader, 1)  # workers prefetched epoch 1 while epoch 0 ran
    assert loader._iterator is iterator  # the same workers: no respawn per epoch
    fresh, _ = create_dataloader(root / "images" / "train", 64, 4, 32, **kw)
    fresh1 = run_epoch(fresh, 1)
    assert flat_paths(epoch1) != flat_paths(epoch0)
    assert flat_paths(epoch1) == flat_paths(fresh1)
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(epoch1, fresh1))
    again0 = run_epoch(loader, 0)  # going back restarts the stream at epoch 0
    assert flat_paths(again0) == flat_paths(epoch0)


def test_epoch_abandoned_half_way_is_restarted(root):
    loader, _ = create_dataloader(root / "images" / "train", 64, 4, 32, shuffle=True, workers=0)
    full = run_epoch(loader, 2)
    loader.set_epoch(2)
    for _ in zip(range(2), loader):
        pass
    assert flat_paths(run_epoch(loader, 2)) == flat_paths(full)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_started_at_a_batch_gives_exactly_the_rest_of_it(root, workers):
    kw = dict(hyp=HYP, augment=True, shuffle=True, seed=3, workers=workers)
    loader, _ = create_dataloader(root / "images" / "train", 64, 4, 32, **kw)
    whole = [run_epoch(loader, epoch) for epoch in (1, 2)]
    resumed, _ = create_dataloader(root / "images" / "train", 64, 4, 32, **kw)  # a resumed run's fresh loader
    resumed.set_epoch(1, start_batch=4)
    rest = [(list(paths), targets.clone()) for _imgs, targets, paths, _ in resumed]
    assert len(rest) == len(whole[0]) - 4 and [p for p, _ in rest] == [p for p, _ in whole[0][4:]]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(rest, whole[0][4:]))  # the same augmentation
    nxt = [(list(paths), targets.clone()) for _imgs, targets, paths, _ in resumed]  # the next epoch, whole
    assert flat_paths(nxt) == flat_paths(whole[1]) and all(torch.equal(x, y) for (_, x), (_, y) in zip(nxt, whole[1]))
    resumed.set_epoch(3, start_batch=len(resumed))  # stopped after its last batch: nothing left to load
    assert list(resumed) == []
    with pytest.raises(ValueError, match="start_batch=7: an epoch has 6 batches"):
        resumed.set_epoch(3, start_batch=7)


def test_rect_with_shuffle_warns_and_keeps_order(root, ddp_log):
    loader, dataset = create_dataloader(root / "images" / "train", 64, 4, 32, rect=True, shuffle=True)
    assert "shuffle turned off" in ddp_log.text and not loader.sampler.shuffle
    for imgs, _, _paths, shapes in loader:
        assert imgs.shape[2] % 32 == 0 and imgs.shape[3] % 32 == 0
        assert all(s is not None for s in shapes)


def test_image_weights_refused_under_ddp(root):
    with pytest.raises(ValueError, match="image_weights"):
        create_dataloader(root / "images" / "train", 64, 4, 32, image_weights=True, rank=0)


def test_image_weights_redraw_images(root):
    loader, dataset = create_dataloader(root / "images" / "train", 64, 4, 32, image_weights=True)
    weights = np.zeros(len(dataset))
    weights[3] = 1.0
    loader.set_image_weights(weights)
    assert set(flat_paths(run_epoch(loader, 0))) == {dataset.im_files[3]}
    with pytest.raises(ValueError, match="image weights"):
        loader.set_image_weights(np.ones(3))


def test_val_loader_rect_no_augmentation(root):
    loader, dataset = create_val_dataloader(root / "images" / "val", 64, 4, 32, workers=0)
    seen = [p for _, _, paths, _ in loader for p in paths]
    assert sorted(seen) == sorted(dataset.im_files) and len(seen) == 10
    a = [t for _, t, _, _ in loader]
    b = [t for _, t, _, _ in loader]
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("n", [10, 11, 24])
def test_samplers_shard_disjoint_and_cover(n):
    world = 3
    train = [TrainSampler(n, 2, r, world, shuffle=True, seed=4) for r in range(world)]
    assert len({len(s) for s in train}) == 1  # every rank runs the same number of batches
    keys = [k for s in train for b in s.epoch_batches(5) for k in b]
    assert len({k.slot for k in keys}) == len(keys)  # disjoint slots
    assert {k.index for k in keys} == set(range(n))  # covering every image
    assert len(keys) - n < world  # padding at most one per rank
    val = [EvalSampler(n, 2, r, world) for r in range(world)]
    indices = [k.index for s in val for b in s.epoch_batches(0) for k in b]
    assert sorted(indices) == list(range(n))  # exactly once


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_two_processes_shards_epochs_and_label_cache(tmp_path):
    root = make_shapes_dataset(tmp_path / "shapes", 24, 9, size=(96, 160))
    workers = launch("tests.workers.data_scenarios:shards", nprocs=2, timeout=110, args=(str(root), "1"))
    assert all(w.returncode == 0 for w in workers), describe(workers)
    recs = records(workers)
    # the node's first process wrote the label cache once; the other read it
    assert [r["cache_written"] for r in recs] == [True, False]
    assert recs[1]["cache_loaded"]
    assert recs[0]["batches"] == recs[1]["batches"] == 3
    for epoch in ("epoch0", "epoch1"):
        a, b = set(recs[0][epoch]), set(recs[1][epoch])
        assert not a & b and len(a | b) == 24, epoch
    for r in recs:
        assert r["epoch1"] != r["epoch0"] and r["epoch1"] == r["fresh1"]
        assert r["sums"][1] == r["sums"][2]  # the same augmentation as a fresh loader's epoch 1
    val = recs[0]["val"] + recs[1]["val"]
    assert len(val) == len(set(val)) == 9
    rect = recs[0]["rect"] + recs[1]["rect"]
    assert len(rect) == 10 and set(rect) == set(val)  # 9 images padded to 2 x 5


class _BatchChurn(torch.utils.data.Dataset):
    """Allocates and frees a batch's worth of image-sized arrays, as a loader worker does, and
    reports the page faults of the later rounds."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> int:
        import resource

        def churn() -> None:
            images = [np.ones((640, 640, 3), np.uint8) for _ in range(16)]
            del images

        churn()  # the first round maps the memory
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            churn()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_workers_reuse_freed_memory_instead_of_faulting_it_in_again():
    from ddp_utils.data.workers import init_worker

    def faults(init) -> int:
        # a spawned worker starts with glibc's default malloc state; a forked one inherits this process's,
        # whose dynamic mmap threshold earlier tests may have raised already
        loader = torch.utils.data.DataLoader(
            _BatchChurn(), batch_size=None, num_workers=1, worker_init_fn=init, multiprocessing_context="spawn"
        )
        return next(iter(loader))

    pages = 5 * 16 * 640 * 640 * 3 // 4096
    assert faults(init_worker) < 0.05 * pages
    assert faults(None) > 0.5 * pages  # what the default malloc does, so the check above means something


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_exit_with_a_loader_half_way_is_quiet(root):
    code = (
        "from ddp_utils.data.loader import create_dataloader\n"
        f"loader, _ = create_dataloader({str(root / 'images' / 'train')!r}, 64, 4, 32, workers=2, shuffle=True)\n"
        "next(iter(loader))\n"  # and exit with the workers running
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert "Exception" not in done.stderr and "killed by signal" not in done.stderr, done.stderr


def test_default_workers_fill_the_cores_and_are_logged(root, ddp_log):
    from ddp_utils.data.workers import default_workers, usable_cores

    auto, _ = create_dataloader(root / "images" / "train", 64, 4, 32, workers=None)
    cores = usable_cores()
    assert auto.num_workers == min(max(cores - 1, 0), 4)  # one core left to the training loop
    assert f"{auto.num_workers} dataloader workers per process ({cores} cores, 1 local process(es), no cap)" in (
        ddp_log.text
    )
    capped, _ = create_dataloader(root / "images" / "train", 64, 4, 32, workers=1)
    assert capped.num_workers == min(1, cores)  # workers stays a cap the user sets
    # a 16-core host with one GPU: 15 workers by default, the user's 8 as a cap; 4 GPUs: 3 each
    assert default_workers(1, None, 64, cores=16) == 15 and default_workers(1, 8, 64, cores=16) == 8
    assert default_workers(4, None, 64, cores=16) == 3 and default_workers(4, 8, 64, cores=16) == 4


def test_a_directory_and_a_list_of_some_of_its_images_keep_a_label_cache_each(tmp_path):
    """Two data yamls over one image directory (the directory, and a .txt list of part of it) used in turn: each
    split has its own cache, so switching between them loads it instead of scanning the labels again."""
    root = make_shapes_dataset(tmp_path / "shapes", 12, 4, size=(64, 96))
    listed = root / "train_part.txt"
    listed.write_text("".join(f"./images/train/{p.name}\n" for p in sorted((root / "images" / "train").iterdir())[:6]))
    sources = [root / "images" / "train", listed]
    datasets = [create_dataloader(source, 64, 4, 32, workers=0)[1] for source in sources * 2]
    assert [d.label_cache_written for d in datasets] == [True, True, False, False]  # each scanned once, then loaded
    assert [d.label_cache_loaded for d in datasets] == [False, False, True, True]
    assert [len(d) for d in datasets] == [12, 6, 12, 6]
    assert sorted(p.name for p in root.rglob("*.ddp.cache")) == ["train.ddp.cache", "train_part.ddp.cache"]
    assert (root / "train_part.ddp.cache").is_file()  # beside the list, as YOLOv5 keeps its .cache
