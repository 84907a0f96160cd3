"""The dataset as YOLOv5's train.py uses it: its attribute names, ``--image-weights`` by
``dataset.indices``, ``labels_to_*_weights``, and a class beyond ``nc`` named in one message."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ddp_utils.data import DataConfigError, create_dataloader, labels_to_class_weights, labels_to_image_weights
from ddp_utils.data.synthetic import DEFAULT_CLASSES, make_shapes_dataset
from tests.workers.data_scenarios import HYP


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_shapes_dataset(tmp_path_factory.mktemp("yolov5") / "shapes", 16, 0, size=(96, 160))


def epoch_paths(loader, epoch):
    loader.set_epoch(epoch)
    return [p for _imgs, _targets, paths, _ in loader for p in paths]


def test_yolov5_attribute_names(root):
    _, dataset = create_dataloader(root / "images" / "train", 64, 4, 32, hyp=HYP, augment=True, workers=0)
    n = dataset.n
    assert n == len(dataset) == len(dataset.labels) == len(dataset.segments) == len(dataset.im_files) == 16
    assert len(dataset.label_files) == n and dataset.shapes.shape == (n, 2)  # (w, h), as YOLOv5's
    assert list(dataset.indices) == list(range(n))
    assert dataset.mosaic_border == [-32, -32] and dataset.img_size == 64 and dataset.stride == 32
    assert dataset.batch.tolist() == [i // 4 for i in range(n)]
    assert dataset.augment and not dataset.rect and dataset.hyp["mosaic"] == HYP["mosaic"]
    assert all(lb.shape[1] == 5 for lb in dataset.labels)


@pytest.mark.parametrize("workers", [0, 2])
def test_image_weights_the_yolov5_way_change_the_drawn_images(root, workers):
    loader, dataset = create_dataloader(root / "images" / "train", 64, 4, 32, workers=workers, shuffle=True)
    nc, maps = len(DEFAULT_CLASSES), np.zeros(len(DEFAULT_CLASSES))
    first = epoch_paths(loader, 0)  # with workers: they are running and have prefetched epoch 1
    assert sorted(first) == sorted(dataset.im_files)
    cw = labels_to_class_weights(dataset.labels, nc).numpy() * (1 - maps) ** 2 / nc
    iw = labels_to_image_weights(dataset.labels, nc=nc, class_weights=cw)
    dataset.indices = random.choices(range(dataset.n), weights=iw, k=dataset.n)  # YOLOv5's train.py
    wanted = {dataset.im_files[i] for i in dataset.indices}
    assert set(epoch_paths(loader, 1)) <= wanted
    dataset.indices = [5] * dataset.n
    assert set(epoch_paths(loader, 2)) == {dataset.im_files[5]}
    with pytest.raises(ValueError, match="indices"):
        dataset.indices = [dataset.n] * dataset.n
    with pytest.raises(ValueError):
        dataset.indices[0] = 1  # read-only: assign a new sequence, so the loader sees it


def test_mosaic_tiles_come_from_indices_and_border_sizes_the_mosaic(root):
    _, dataset = create_dataloader(root / "images" / "train", 64, 4, 32, hyp=HYP, augment=True, workers=0)
    img, *_ = dataset[0]
    assert img.shape[1:] == (64, 64)
    dataset.mosaic_border = [-16, -16]  # YOLOv5: the mosaic is 2 * imgsz + 2 * border on a side
    img, *_ = dataset[0]
    assert img.shape[1:] == (96, 96)


def test_class_and_image_weights_as_yolov5_defines_them():
    labels = [np.array([[0, 0.5, 0.5, 0.1, 0.1], [0, 0.5, 0.5, 0.1, 0.1]]), np.array([[2, 0.5, 0.5, 0.1, 0.1]])]
    cw = labels_to_class_weights(labels, 4)
    # counts 2, 0 (taken as 1), 1, 0 (as 1): weights 1/2, 1, 1, 1 normalised
    np.testing.assert_allclose(cw.numpy(), np.array([0.5, 1, 1, 1]) / 3.5, rtol=1e-6)
    assert labels_to_class_weights([], 4).numel() == 0
    iw = labels_to_image_weights(labels, 4, np.array([1.0, 0, 10, 0]))
    assert iw.tolist() == [2.0, 10.0]
    assert labels_to_image_weights(labels, 4).tolist() == [2.0, 1.0]  # default: object counts


def test_a_class_beyond_nc_names_the_label_file_and_the_yaml(root):
    _, dataset = create_dataloader(root / "images" / "train", 64, 4, 32, workers=0)
    dataset.check_classes(len(DEFAULT_CLASSES), "shapes.yaml")  # fine
    with pytest.raises(DataConfigError) as err:
        dataset.check_classes(1, "shapes.yaml")
    message = str(err.value)
    bad = next(f for f, lb in zip(dataset.label_files, dataset.labels) if (lb[:, 0] >= 1).any())
    assert bad in message and "shapes.yaml" in message and "nc=1" in message and "\n" not in message
