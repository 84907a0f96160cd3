"""A batch's mosaics made together (``mosaic_batch.py``) are the samples of ``dataset[key]``, bit for bit.

Each batch here is compared with the per-sample route (``YoloDataset.__getitem__``, unchanged):
images, labels (values, dtype, shape), paths and shapes equal, not close, over several epochs,
hyps (the usual one, HSV off, flips both ways, some samples without mosaic or with mixup, which
start over per sample), sizes (the colour conversion done for the whole batch at once at sizes
that are no multiple of a SIMD width) and with and without the RAM cache.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from ddp_utils.data import mosaic_batch as batch_module
from ddp_utils.data.dataset import SampleKey, YoloDataset
from ddp_utils.data.labels import find_images, load_labels
from ddp_utils.data.loader import create_dataloader
from ddp_utils.data.synthetic import make_shapes_dataset
from ddp_utils.data.transfer import BatchRequest, PooledDataset
from tests.workers.data_scenarios import HYP


@pytest.fixture(scope="module")
def dataset_root(tmp_path_factory):
    return make_shapes_dataset(tmp_path_factory.mktemp("ds") / "shapes", 12, 0, size=(40, 160))


@pytest.fixture(scope="module")
def label_set(dataset_root):
    labels = load_labels(find_images(dataset_root / "images" / "train"))
    empty = labels.labels[3][:0]
    return replace(labels, labels=[empty if i in (3, 7) else lab for i, lab in enumerate(labels.labels)])


def batches(n: int, size: int = 16):
    """Keys of several epochs, images repeated and out of order, batches of ``size`` and a short last one."""
    keys = [SampleKey(epoch, slot, (5 * slot + epoch) % n) for epoch in range(4) for slot in range(3 * n)]
    return [keys[i : i + size] for i in range(0, len(keys), size)]


def assert_same_samples(got, ref, context):
    assert len(got) == len(ref)
    for k, ((img, labels, path, shapes), (ref_img, ref_labels, ref_path, ref_shapes)) in enumerate(zip(got, ref)):
        assert img.dtype == ref_img.dtype and torch.equal(img, ref_img), f"{context}: image {k}"
        assert labels.dtype == ref_labels.dtype and labels.shape == ref_labels.shape, f"{context}: labels {k}"
        assert torch.equal(labels, ref_labels), f"{context}: labels {k}"
        assert (path, shapes) == (ref_path, ref_shapes), f"{context}: path/shapes {k}"


HYPS = {
    "usual": HYP,
    "no_hsv_both_flips": dict(HYP, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, flipud=0.5, fliplr=0.5),
    "some_start_over": dict(HYP, mosaic=0.6, mixup=0.3, scale=0.9, translate=0.3),
}


@pytest.mark.parametrize(("imgsz", "cache"), [(64, "ram"), (50, "ram"), (96, None)])
@pytest.mark.parametrize("hyp_name", list(HYPS))
def test_batch_route_gives_the_per_sample_route_samples(monkeypatch, label_set, imgsz, cache, hyp_name):
    ds = YoloDataset(label_set, imgsz=imgsz, augment=True, hyp=HYPS[hyp_name], cache=cache, seed=7)
    made = 0
    draw_and_warp = batch_module._draw_and_warp

    def counting(*args):
        nonlocal made
        mosaic = draw_and_warp(*args)
        made += mosaic is not None
        return mosaic

    monkeypatch.setattr(batch_module, "_draw_and_warp", counting)
    boxes = 0
    for keys in batches(len(ds)):
        got = ds.__getitems__(keys)
        assert_same_samples(got, [ds[key] for key in keys], f"{hyp_name}, imgsz {imgsz}, keys {keys[0]}..")
        boxes += sum(len(sample[1]) for sample in got)
    total = 4 * 3 * len(ds)
    assert made > total // 3 and boxes > total  # the batch route made most samples, with boxes to compare
    if hyp_name == "some_start_over":
        assert made < total  # and some started over per sample


def test_hyps_the_batch_route_leaves_to_the_per_sample_route(label_set):
    rotate = YoloDataset(label_set, imgsz=64, augment=True, hyp=dict(HYP, degrees=10.0, shear=2.0))
    assert batch_module.batch_plan(rotate) is None
    keys = batches(len(rotate))[0]
    assert_same_samples(rotate.__getitems__(keys), [rotate[key] for key in keys], "rotation")
    border = YoloDataset(label_set, imgsz=64, augment=True, hyp=HYP)
    border.mosaic_border = [-16, -16]
    assert batch_module.batch_plan(border) is None
    assert batch_module.batch_plan(YoloDataset(label_set, imgsz=64, augment=False, hyp=HYP)) is None
    assert batch_module.batch_plan(YoloDataset(label_set, imgsz=64, augment=True, hyp=HYP)) is not None


def test_plain_indices_and_the_pooled_fetch_take_the_batch_route(label_set):
    ds = YoloDataset(label_set, imgsz=64, augment=True, hyp=HYP)
    assert_same_samples(ds.__getitems__([0, 5, 5, 11]), [ds[i] for i in (0, 5, 5, 11)], "plain indices")
    keys = batches(len(ds))[1]
    slot, samples = PooledDataset(ds).__getitems__(BatchRequest(keys, 3))
    assert slot == 3
    assert_same_samples(samples, [ds[key] for key in keys], "pooled fetch")


def test_the_loader_fetches_whole_batches(monkeypatch, dataset_root):
    loader, ds = create_dataloader(
        dataset_root / "images" / "train", 64, 4, 32, hyp=HYP, augment=True, workers=0, shuffle=True, seed=1
    )
    fetched = []
    getitems = YoloDataset.__getitems__
    monkeypatch.setattr(
        YoloDataset, "__getitems__", lambda self, keys: fetched.append(list(keys)) or getitems(self, keys)
    )
    loader.set_epoch(2)
    for (imgs, targets, paths, shapes), keys in zip(loader, iter(lambda: fetched[-1], None)):
        ref_imgs, ref_targets, ref_paths, ref_shapes = YoloDataset.collate_fn([ds[key] for key in keys])
        assert torch.equal(imgs, ref_imgs) and torch.equal(targets, ref_targets)
        assert (paths, shapes) == (ref_paths, ref_shapes)
    assert len(fetched) == len(loader) and all(len(keys) == 4 for keys in fetched[:-1])
    assert np.unique([key.epoch for keys in fetched for key in keys]).tolist() == [2]


def test_a_batch_over_the_pixel_bound_is_made_in_parts(monkeypatch, label_set):
    ds = YoloDataset(label_set, imgsz=64, augment=True, hyp=HYP, seed=2)
    keys = batches(len(ds))[2]
    whole = ds.__getitems__(keys)
    monkeypatch.setattr(batch_module, "_CHUNK_PIXELS", 5 * 64 * 64)  # parts of 5 samples
    finished, finish_images = [], batch_module._finish_images
    monkeypatch.setattr(
        batch_module, "_finish_images", lambda canvas, m: finished.append(len(canvas)) or finish_images(canvas, m)
    )
    parts = ds.__getitems__(keys)
    assert_same_samples(parts, whole, "in parts")
    assert finished == [5, 5, 5, 1]
