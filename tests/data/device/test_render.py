"""The device path's images (``data/device/render.py``, run here on the CPU) are the CPU path's, to interpolation.

For the same draws the boxes are identical (``test_recipes.py``) and the pixels close: OpenCV
computes in fixed point (``cv2.resize``'s 11-bit weights, ``warpAffine``'s 1/32-pixel coordinates
and 15-bit weights, integer HSV tables) where the device path computes in float32, so a pixel
may differ by a level or two, and OpenCV's 8-bit HSV round trip turns such a level in a dark or
grey pixel into a few more. The tolerance stated and held here, per image, over every hyp key:
a mean absolute difference of at most 0.6 levels (0.25 without HSV), at most 8 % of values off
by more than 2 levels (0.1 % without HSV), none by more than 32 (4 without HSV). And a batch size
and image size sweep, other formats, EXIF-rotated and undecodable JPEGs, the loader end to end.

The kernels are tested here in their eager form (the same code, uncompiled: the fast tier compiles nothing);
``test_the_compiled_kernels_are_the_eager_ones`` (slow) holds the compiled kernels to it bit for bit. The
positive controls break one thing each (the x/y order, the pixel-centre convention, a half-pixel shift, the
border, each HSV gain) and must fail the tolerance.
"""

from __future__ import annotations

import logging
import weakref

import cv2
import numpy as np
import pytest
import torch

import ddp_utils.data.device.kernels as kernels
import ddp_utils.data.device.plan as plan
import ddp_utils.data.device.render as device_render
from ddp_utils.data.dataset import SampleKey, YoloDataset
from ddp_utils.data.device.prefetch import DevicePrefetcher
from ddp_utils.data.device.recipes import Layer, Placement, Recipe, RecipeCollate, pack_sources, plan_sample
from ddp_utils.data.device.reference import hsv_jitter, reference_render
from ddp_utils.data.device.render import Renderer, augment_choice, augment_place, warm_up_batch
from ddp_utils.data.labels import find_images, load_labels
from ddp_utils.data.loader import create_dataloader
from ddp_utils.data.synthetic import make_shapes_dataset
from tests.workers.data_scenarios import AUGMENT_HYPS, HYP

CPU = torch.device("cpu")
HYPS = AUGMENT_HYPS
EAGER = Renderer(CPU, compiled=False)
STRONG_HSV = dict(HYP, hsv_h=0.3)  # hue gains of 0.7-1.3


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_shapes_dataset(tmp_path_factory.mktemp("device") / "shapes", 14, 0, size=(40, 200))


@pytest.fixture(scope="module")
def label_set(root):
    return load_labels(find_images(root / "images" / "train"))


def planned(dataset: YoloDataset, keys: list[SampleKey]):
    return RecipeCollate(dataset)([plan_sample(dataset, key) for key in keys])[0]


def rendered_and_reference(dataset: YoloDataset, keys: list[SampleKey], renderer: Renderer = EAGER):
    return renderer(planned(dataset, keys), to_float=False), torch.stack([dataset[key][0] for key in keys])


def assert_close_images(got: torch.Tensor, ref: torch.Tensor, hsv: bool = True) -> None:
    assert got.dtype == ref.dtype == torch.uint8 and got.shape == ref.shape
    for k, (a, b) in enumerate(zip(got, ref)):
        diff = (a.int() - b.int()).abs()
        mean, over2, worst = diff.float().mean().item(), (diff > 2).float().mean().item(), diff.max().item()
        bounds = (0.6, 0.08, 32) if hsv else (0.25, 0.001, 4)
        assert mean <= bounds[0] and over2 <= bounds[1] and worst <= bounds[2], (k, mean, over2, worst)


@pytest.mark.parametrize(("imgsz", "batch"), [(64, 1), (96, 4), (128, 5)])
@pytest.mark.parametrize("hyp_name", list(HYPS))
def test_rendered_images_are_the_cpu_paths_to_interpolation(label_set, imgsz, batch, hyp_name):
    dataset = YoloDataset(label_set, imgsz, 4, augment=True, hyp=HYPS[hyp_name], seed=5)
    keys = [SampleKey(2, slot, (3 * slot + 1) % len(dataset)) for slot in range(batch)]
    got, ref = rendered_and_reference(dataset, keys)
    assert_close_images(got, ref, hsv=hyp_name != "no_hsv")


def test_rect_training_and_the_ram_cache_render_too(label_set):
    for kwargs in (dict(rect=True), dict(cache="ram")):
        dataset = YoloDataset(label_set, 96, 4, augment=True, hyp=dict(HYP, degrees=3.0), seed=4, **kwargs)
        shape = tuple(dataset[SampleKey(0, 0, 0)][0].shape)
        keys = [
            SampleKey(0, s, i) for s, i in enumerate(range(4)) if tuple(dataset[SampleKey(0, s, i)][0].shape) == shape
        ]
        got, ref = rendered_and_reference(dataset, keys)
        assert_close_images(got, ref)


def test_the_kernels_say_what_the_slow_reference_says(label_set):
    # render_reference.py (grid_sample, F.interpolate, int64 table lookups) is the independent statement
    for name, hyp in HYPS.items():
        dataset = YoloDataset(label_set, 96, 4, augment=True, hyp=hyp, seed=9)
        batch = planned(dataset, [SampleKey(0, slot, (2 * slot) % len(dataset)) for slot in range(5)])
        diff = (EAGER(batch, to_float=False).int() - reference_render(batch).int()).abs()
        # the reference rounds its grid through grid_sample's [-1, 1]: a level apart, a few more after HSV
        assert diff.max() <= (1 if name == "no_hsv" else 12) and (diff > 1).float().mean() < 0.002, name


def _tables_changed(monkeypatch, change) -> None:
    # the render's tables as the planner makes them, then changed: a kernel that read them wrongly
    original = plan.row_tables

    def changed(row_plan, tiles):
        ints, floats = original(row_plan, tiles)
        change(ints, floats)
        return ints, floats

    monkeypatch.setattr(device_render, "row_tables", changed)


def _swap_xy(ints, floats):
    for layer in (0, 1):
        inverse = floats[:, layer * kernels.LAYER_FLOATS :][:, :9].reshape(-1, 3, 3)
        inverse[:] = inverse[:, [1, 0, 2]][:, :, [1, 0, 2]]


def _half_pixel(ints, floats):
    for layer in (0, 1):
        floats[:, layer * kernels.LAYER_FLOATS + 10] += 0.5
        floats[:, layer * kernels.LAYER_FLOATS + 12] += 0.5


def _align_corners_taps(dst, src_size, dst_size):
    # the other pixel-centre convention (align_corners=True): pixel i at i * (n0 - 1) / (n - 1)
    point = dst.float() * (src_size - 1).float() / (dst_size - 1).clamp_min(1).float()
    first = point.floor()
    return first.long(), torch.minimum(first.long() + 1, src_size - 1), point - first


@pytest.mark.parametrize("fault", ["swapped x/y", "align_corners flipped", "half-pixel shift", "border 0"])
def test_the_tolerance_catches_a_wrong_geometry(label_set, monkeypatch, fault):
    dataset = YoloDataset(label_set, 96, 4, augment=True, hyp=HYPS["no_hsv"], seed=5)
    keys = [SampleKey(2, slot, slot) for slot in range(6)]
    got, ref = rendered_and_reference(dataset, keys)
    assert_close_images(got, ref, hsv=False)  # unbroken, it passes
    if fault == "swapped x/y":
        _tables_changed(monkeypatch, _swap_xy)
    elif fault == "half-pixel shift":
        _tables_changed(monkeypatch, _half_pixel)
    elif fault == "align_corners flipped":
        monkeypatch.setattr(kernels, "_taps", _align_corners_taps)
    else:
        monkeypatch.setattr(kernels, "_PAD", 0.0)
    broken, _ = rendered_and_reference(dataset, keys)
    with pytest.raises(AssertionError):
        assert_close_images(broken, ref, hsv=False)


def one_image_batch(bgr: np.ndarray, gains) -> object:
    """A batch of one letterbox of ``bgr`` at its own size (no warp, no resize): the HSV round trip alone."""
    h, w = bgr.shape[:2]
    layer = Layer(np.eye(3), [Placement(0, (0, 0, w, h), (1.0, 0.0, 1.0, 0.0), (0, 0, w, h))])
    recipe = Recipe((h, w), [layer], None, np.asarray(gains, float), False, False)
    return pack_sources([recipe], [bgr], [(h, w)], [(h, w)], ["random"])


def opencv_hsv(bgr: np.ndarray, gains) -> np.ndarray:
    hsv = cv2.cvtColor(bgr, cv2.COLOR_BGR2HSV)
    cv2.transform(hsv, np.diag(gains).astype(np.float32), dst=hsv)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[:, :, ::-1].transpose(2, 0, 1)


GAINS = ([1.0, 1.0, 1.0], [1.015, 0.3, 1.4], [0.985, 1.7, 0.6], [1.3, 1.0, 1.0], [0.7, 1.2, 0.9])


@pytest.mark.parametrize("gains", GAINS)
def test_the_kernels_hsv_is_opencvs_8_bit_round_trip(gains):
    bgr = np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8)
    got = EAGER(one_image_batch(bgr, gains), to_float=False)[0].numpy()
    assert np.abs(got.astype(int) - opencv_hsv(bgr, gains)).max() <= 1, gains


@pytest.mark.parametrize("gain", ["hue", "saturation", "value"])
def test_each_hsv_gain_left_out_fails(label_set, monkeypatch, gain):
    # The sharp test: the kernel's round trip against OpenCV's on the same pixels, to a level, at the default hyp's
    # hue gain (1 +- 0.015, too small for the images' tolerance to see); and the images' tolerance for the others
    column = kernels.GAINS + ["hue", "saturation", "value"].index(gain)
    bgr = np.random.default_rng(1).integers(0, 256, (40, 40, 3), dtype=np.uint8)
    gains = [1.015, 0.7, 1.3]
    _tables_changed(monkeypatch, lambda ints, floats: floats[:, column].__setitem__(slice(None), 1.0))
    got = EAGER(one_image_batch(bgr, gains), to_float=False)[0].numpy()
    assert np.abs(got.astype(int) - opencv_hsv(bgr, gains)).max() > 1
    if gain != "hue":
        dataset = YoloDataset(label_set, 96, 4, augment=True, hyp=HYP, seed=6)
        broken, ref = rendered_and_reference(dataset, [SampleKey(1, slot, slot) for slot in range(6)])
        with pytest.raises(AssertionError):
            assert_close_images(broken, ref)


def test_the_reference_hsv_is_opencvs_too():
    bgr = np.random.default_rng(0).integers(0, 256, (1, 40, 40, 3), dtype=np.uint8)
    for gains in GAINS:
        rgb = torch.from_numpy(bgr[..., ::-1].transpose(0, 3, 1, 2).copy())
        got = hsv_jitter(rgb, torch.tensor([gains], dtype=torch.float32))[0].numpy()
        assert np.abs(got.astype(int) - opencv_hsv(bgr[0], gains)).max() <= 1, gains


def test_other_formats_rotated_and_undecodable_jpegs_fall_back_to_the_cpu_decoder(tmp_path, root, caplog):
    from PIL import Image

    files = sorted(find_images(root / "images" / "train"))[:3]
    png = tmp_path / "a.png"
    cv2.imwrite(str(png), cv2.imread(files[0]))
    rotated = tmp_path / "r.jpg"
    exif = Image.Exif()
    exif[0x0112] = 8
    Image.open(files[1]).save(rotated, exif=exif.tobytes())
    dataset = YoloDataset(load_labels([str(png), str(rotated), files[2]]), 64, 4, augment=True, hyp=HYP, seed=1)
    keys = [SampleKey(0, slot, slot % 3) for slot in range(6)]
    batch = planned(dataset, keys)
    assert sum(batch.jpeg) == 1  # the plain JPEG alone
    cpu_path = torch.stack([dataset[key][0] for key in keys])
    assert_close_images(EAGER(batch, to_float=False), cpu_path)
    # bytes the decoder refuses (here: cut short) cost one host decode of that file, said once in the log
    jpeg = batch.jpeg.index(True)
    sources = [b"\xff\xd8\xff" if i == jpeg else s for i, s in enumerate(batch.sources)]
    broken = pack_sources(batch.recipes, sources, batch.sizes, batch.originals, batch.paths)
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        assert_close_images(Renderer(CPU, compiled=False)(broken, to_float=False), cpu_path)  # its tile: the host's
    named = [r.getMessage() for r in caplog.records if batch.paths[jpeg] in r.getMessage()]
    assert len(named) == 1 and "cannot decode it" in named[0], named


def test_large_sources_are_decoded_and_resized_a_group_at_a_time(label_set, monkeypatch):
    dataset = YoloDataset(label_set, 96, 4, augment=True, hyp=HYPS["general_warp_mixup_flips"], seed=2)
    batch = planned(dataset, [SampleKey(0, slot, slot) for slot in range(6)])
    whole = EAGER(batch, to_float=False)
    calls, alive, budget = [], [], 3 * 200 * 200  # about one original at most, a group
    decode = EAGER.decoder.decode

    def decode_a_group(datas, paths):
        alive.append(sum(ref() is not None for ref in refs))  # the groups before: freed once their tiles exist
        calls.append(paths)
        images = decode(datas, paths)
        refs.extend(weakref.ref(image) for image in images if image is not None)
        return images

    refs, sources = [], EAGER._sources

    def sources_of_a_group(*args):
        flat, layouts, sizes = sources(*args)
        refs.append(weakref.ref(flat))  # the group's originals, in one buffer
        return flat, layouts, sizes

    monkeypatch.setattr(EAGER.decoder, "decode", decode_a_group)
    monkeypatch.setattr(EAGER, "_sources", sources_of_a_group)
    monkeypatch.setattr(device_render, "DECODE_GROUP_BYTES", budget)
    assert torch.equal(EAGER(batch, to_float=False), whole)
    assert alive == [0] * len(calls)
    size = {path: 3 * h * w for path, (h, w) in zip(batch.paths, batch.originals)}
    assert len(calls) > 1 and sum(map(len, calls)) == sum(batch.jpeg), calls
    assert all(len(paths) == 1 or sum(size[p] for p in paths) <= budget for paths in calls)


def test_mixup_is_rendered_only_where_a_sample_has_one(label_set, monkeypatch):
    dataset = YoloDataset(label_set, 64, 4, augment=True, hyp=dict(HYP, mixup=0.3), seed=3)
    batch = planned(dataset, [SampleKey(0, slot, slot % len(dataset)) for slot in range(12)])
    mixed = sum(recipe.mix is not None for recipe in batch.recipes)
    assert 0 < mixed < len(batch)
    calls = []
    render = kernels.render_rows
    monkeypatch.setattr(
        device_render, "render_rows", lambda *a, **k: calls.append((len(a[1]), a[7])) or render(*a, **k)
    )
    got = EAGER(batch, to_float=False)
    assert calls == [(len(batch), 1), (max(mixed, 2), 2)]  # every sample's first layer; the mixups' two
    assert_close_images(got, torch.stack([dataset[SampleKey(0, s, s % len(dataset))][0] for s in range(12)]))


def test_the_float_batch_is_the_images_over_255_in_the_steps_layout(label_set):
    batch = planned(
        YoloDataset(label_set, 64, 4, augment=True, hyp=HYP, seed=1), [SampleKey(0, 0, 0), SampleKey(0, 1, 1)]
    )
    images = EAGER(batch, to_float=False)
    for channels_last in (True, False):
        floats = EAGER(batch, to_float=True, channels_last=channels_last)
        assert floats.dtype == torch.float32 and torch.equal(floats, images.float() / 255)
        assert floats.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_compiled_kernels_are_the_eager_ones(label_set):
    compiled = Renderer(CPU, compiled=True)
    batches = [warm_up_batch()]
    for hyp in (*HYPS.values(), STRONG_HSV):
        dataset = YoloDataset(label_set, 96, 4, augment=True, hyp=hyp, seed=7)
        batches.append(planned(dataset, [SampleKey(1, slot, (5 * slot) % len(dataset)) for slot in range(5)]))
    batches.append(
        planned(YoloDataset(label_set, 64, 4, augment=True, hyp=HYP, rect=True, seed=1), [SampleKey(0, 0, 0)])
    )
    for batch in batches:
        for channels_last in (True, False):
            got = compiled(batch, channels_last=channels_last)
            assert torch.equal(got, EAGER(batch, channels_last=channels_last))
            assert got.stride() == EAGER(batch, channels_last=channels_last).stride()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_and_prefetcher_give_the_cpu_paths_batches(root, workers):
    kwargs = dict(hyp=HYPS["general_warp_mixup_flips"], augment=True, shuffle=True, seed=3, workers=workers)
    device_loader, _ = create_dataloader(root / "images" / "train", 64, 4, 32, augment_on="device", **kwargs)
    cpu_loader, _ = create_dataloader(root / "images" / "train", 64, 4, 32, **kwargs)
    for loader in (device_loader, cpu_loader):
        loader.set_epoch(1)
    got = list(DevicePrefetcher(device_loader, CPU))  # the loader thread, the compiled kernels
    ref = list(DevicePrefetcher(cpu_loader, CPU))
    assert len(got) == len(ref) == len(cpu_loader)
    for (imgs, targets, paths, shapes), (ref_imgs, ref_targets, ref_paths, ref_shapes) in zip(got, ref):
        assert torch.equal(targets, ref_targets) and paths == ref_paths and shapes == ref_shapes
        assert imgs.dtype == ref_imgs.dtype == torch.float32
        assert_close_images((imgs * 255).round().to(torch.uint8), (ref_imgs * 255).round().to(torch.uint8))
    if workers:  # the same batches, bit for bit, whatever the number of workers
        device_loader, _ = create_dataloader(
            root / "images" / "train", 64, 4, 32, augment_on="device", **kwargs | {"workers": 0}
        )
        device_loader.set_epoch(1)
        for (imgs, *_), (again, *_) in zip(got, DevicePrefetcher(device_loader, CPU)):
            assert torch.equal(imgs, again)


def test_where_the_images_are_made():
    assert augment_place("auto", "cpu") == "workers"  # the CPU path stays the CPU's default, bit-identical
    assert augment_place("device", "cpu") == "device" and augment_place("workers", "cuda") == "workers"
    assert augment_place("auto", "cuda", quad=True) == augment_place("auto", "cuda", cache="ram") == "workers"
    with pytest.raises(ValueError, match="quad"):
        create_dataloader("unused", 64, 4, 32, augment=True, quad=True, augment_on="device")


def test_one_line_says_where_the_images_are_made_and_why(monkeypatch):
    assert augment_choice("auto", "cpu")[1].startswith("images made on the loader workers (OpenCV): --augment-on auto")
    assert "--quad" in augment_choice("auto", "cuda", quad=True)[1]
    assert "--cache ram" in augment_choice("auto", "cuda", cache="ram")[1]
    place, line = augment_choice("device", "cpu")
    assert place == "device" and line.startswith("images made on the device cpu (--augment-on device): decoded by")
    monkeypatch.setattr(device_render, "jpeg_decoder", lambda device: None)  # a GPU host where no decoder loads
    place, line = augment_choice("auto", "cuda:0")
    assert place == "workers" and "no JPEG decoder loads on cuda:0" in line
