"""A sample's recipe (``recipes.py``) has the draws and the labels of ``dataset[key]``, exactly.

The workers of ``--augment-on device`` make no pixel: each sample is its draws and labels and a
:class:`Recipe`. The labels (values, dtype, shape), paths and shapes must equal the CPU path's
for every hyp key the dataset reads (mosaic, mixup, degrees, shear, perspective, translate, scale,
HSV, both flips), rect training, odd sizes, with and without the RAM cache; and the batch names
each image it needs once, as JPEG bytes or, where the device path cannot take the file, as the
CPU path's pixels.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from ddp_utils.data.dataset import SampleKey, YoloDataset
from ddp_utils.data.device.recipes import Recipe, RecipeBatch, RecipeCollate, image_source, plan_sample
from ddp_utils.data.images import note_bad_image
from ddp_utils.data.labels import find_images, load_labels
from ddp_utils.data.synthetic import make_shapes_dataset
from tests.data.test_headers import write_jpeg_kinds
from tests.workers.data_scenarios import AUGMENT_HYPS, HYP

HYPS = AUGMENT_HYPS


@pytest.fixture(scope="module")
def label_set(tmp_path_factory):
    root = make_shapes_dataset(tmp_path_factory.mktemp("recipes") / "shapes", 14, 0, size=(40, 160))
    return load_labels(find_images(root / "images" / "train"))


def keys(n: int, count: int = 24) -> list[SampleKey]:
    return [SampleKey(epoch, slot, (5 * slot + epoch) % n) for epoch in (0, 3) for slot in range(count // 2)]


@pytest.mark.parametrize(("imgsz", "cache", "rect"), [(64, None, False), (50, "ram", False), (96, None, True)])
@pytest.mark.parametrize("hyp_name", list(HYPS))
def test_a_recipe_has_the_labels_path_and_shapes_of_the_sample(label_set, imgsz, cache, rect, hyp_name):
    dataset = YoloDataset(label_set, imgsz, 4, augment=True, hyp=HYPS[hyp_name], cache=cache, rect=rect, seed=7)
    for key in keys(len(dataset)):
        recipe, labels, path, shapes = plan_sample(dataset, key)
        _, ref_labels, ref_path, ref_shapes = dataset[key]
        assert labels.dtype == ref_labels.dtype and labels.shape == ref_labels.shape, key
        assert torch.equal(labels, ref_labels), key
        assert (path, shapes) == (ref_path, ref_shapes), key
        assert isinstance(recipe, Recipe) and recipe.size == tuple(dataset[key][0].shape[1:]), key


def test_the_draws_that_make_the_image_are_the_samples(label_set):
    # flips and HSV gains are drawn as __getitem__ draws them: a flip seen in the recipe shows in the sample
    hyp = dict(HYP, flipud=0.5, fliplr=0.5, mixup=0.5)
    dataset = YoloDataset(label_set, 64, 4, augment=True, hyp=hyp, seed=1)
    recipes = [plan_sample(dataset, key)[0] for key in keys(len(dataset), 40)]
    assert {r.flip_ud for r in recipes} == {r.flip_lr for r in recipes} == {True, False}
    assert {r.mix is None for r in recipes} == {True, False}  # some mixups among them
    assert all(r.gains is not None and r.gains.shape == (3,) for r in recipes)
    assert all(len(r.layers) == (1 if r.mix is None else 2) for r in recipes)
    assert all(1 <= len(layer.placements) <= 4 for r in recipes for layer in r.layers)


def test_a_batch_reads_each_image_it_uses_once_and_names_it(label_set):
    dataset = YoloDataset(label_set, 64, 4, augment=True, hyp=HYP, seed=2)
    samples = [plan_sample(dataset, key) for key in keys(len(dataset), 16)]
    batch, labels, paths, shapes = RecipeCollate(dataset)(samples)
    assert isinstance(batch, RecipeBatch) and len(batch) == 16
    used = {p.image for r in batch.recipes for layer in r.layers for p in layer.placements}
    assert used == set(range(len(batch.sources)))  # renumbered: every source used, none twice
    assert len(set(batch.paths)) == len(batch.paths)
    for source, path, size in zip(batch.sources, batch.paths, batch.sizes):
        assert isinstance(source, bytes) and source[:2] == b"\xff\xd8"  # the synthetic JPEGs travel as bytes
        assert Path(path).read_bytes() == source and max(size) == 64
    assert labels[:, 0].tolist() == sorted(labels[:, 0].tolist())  # the image's place in the batch
    assert list(paths) == [s[2] for s in samples] and list(shapes) == [s[3] for s in samples]


def test_other_formats_rotated_jpegs_and_cached_images_travel_as_the_cpu_paths_pixels(tmp_path, label_set):
    import cv2
    from PIL import Image

    png = tmp_path / "a.png"
    cv2.imwrite(str(png), np.full((30, 40, 3), 90, np.uint8))
    rotated = tmp_path / "r.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.new("RGB", (60, 30), (10, 20, 30)).save(rotated, exif=exif.tobytes())
    plain = tmp_path / "p.jpg"
    Image.new("RGB", (60, 30), (10, 20, 30)).save(plain)
    files = load_labels([str(png), str(rotated), str(plain)])
    dataset = YoloDataset(files, 64, 4, augment=True, hyp=HYP)
    for i, path in enumerate(dataset.im_files):
        source = image_source(dataset, i)
        if path.endswith("p.jpg"):
            assert source == plain.read_bytes()
        else:
            np.testing.assert_array_equal(source, dataset.load_image(i)[0])
    cached = YoloDataset(label_set, 64, 4, augment=True, hyp=HYP, cache="ram")
    np.testing.assert_array_equal(image_source(cached, 3), cached.load_image(3)[0])


def test_jpegs_a_batched_device_decode_does_not_take_travel_as_pixels_named_once(tmp_path, capfd, said):
    kinds = write_jpeg_kinds(tmp_path)
    files = [str(kinds[k]) for k in ("baseline", "progressive", "grey", "cmyk", "rgb_coded", "overwritten")]
    dataset = YoloDataset(load_labels(files), 64, 4, augment=True, hyp=HYP)
    capfd.readouterr()
    for _ in range(3):  # as three epochs' batches would ask
        for i, path in enumerate(dataset.im_files):
            source = image_source(dataset, i)
            kind = Path(path).stem
            if kind in ("baseline", "overwritten"):  # the header is all a worker reads: damage shows at the decode
                assert source == Path(path).read_bytes(), kind
            else:  # decoded here by the CPU path, as the workers path would
                np.testing.assert_array_equal(source, dataset.load_image(i)[0])
    assert "JPEG" not in capfd.readouterr().err
    unfit = {"progressive": "a progressive JPEG", "grey": "a greyscale JPEG", "cmyk": "a CMYK (4-component) JPEG"}
    unfit["rgb_coded"] = "an RGB-coded (not YCbCr) JPEG"
    assert sorted(said) == sorted(
        f"{kinds[k]}: {why}, which nvJPEG's batched decode (the device path on a GPU) does not take; "
        "the CPU decoder's pixels are used"
        for k, why in unfit.items()
    )


def test_a_jpeg_noted_bad_on_the_device_travels_as_pixels_after(tmp_path, said):
    kinds = write_jpeg_kinds(tmp_path)
    dataset = YoloDataset(load_labels([str(kinds["overwritten"]), str(kinds["baseline"])]), 64, 4, augment=True)
    damaged = dataset.im_files.index(str(kinds["overwritten"]))
    assert isinstance(image_source(dataset, damaged), bytes)
    note_bad_image(str(kinds["overwritten"]), "the device could not decode it")  # as the device decoder says it
    tile = image_source(dataset, damaged)
    expected = cv2.imread(str(kinds["overwritten"]), cv2.IMREAD_COLOR)  # today's pixels
    np.testing.assert_array_equal(tile, cv2.resize(expected, (64, 48), interpolation=cv2.INTER_LINEAR))
    assert isinstance(image_source(dataset, 1 - damaged), bytes)
    assert said == [f"{kinds['overwritten']}: the device could not decode it; the CPU decoder's pixels are used"]
