"""The synthetic shapes dataset: deterministic, valid YOLO data, written atomically."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from ddp_utils.data import synthetic
from ddp_utils.data.labels import find_images, load_labels
from ddp_utils.data.synthetic import DEFAULT_CLASSES, SHAPE_COLOURS, generate, make_shapes_dataset


def tree_bytes(root: Path, pattern: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob(pattern))}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_shapes_dataset(tmp_path_factory.mktemp("shapes") / "shapes", n_train=12, n_val=4, seed=3)


def test_layout_and_manifest(shapes: Path) -> None:
    assert len(list((shapes / "images" / "train").glob("*.jpg"))) == 12
    assert len(list((shapes / "images" / "val").glob("*.jpg"))) == 4
    assert len(list((shapes / "labels" / "train").glob("*.txt"))) == 12
    manifest = json.loads((shapes / "shapes.json").read_text())
    assert manifest["seed"] == 3 and manifest["classes"] == list(DEFAULT_CLASSES)
    assert not list(shapes.parent.glob(".*partial*")), "the temporary directory is gone"


def test_same_seed_same_dataset(shapes: Path, tmp_path: Path) -> None:
    again = make_shapes_dataset(tmp_path / "again", n_train=12, n_val=4, seed=3)
    assert tree_bytes(again, "*.txt") == tree_bytes(shapes, "*.txt")
    assert tree_bytes(again, "*.jpg") == tree_bytes(shapes, "*.jpg")
    other = make_shapes_dataset(tmp_path / "other", n_train=12, n_val=4, seed=4)
    assert tree_bytes(other, "*.txt") != tree_bytes(shapes, "*.txt")
    # each image has its own stream: a bigger split starts with the same images
    bigger = make_shapes_dataset(tmp_path / "bigger", n_train=14, n_val=0, seed=3)
    assert (bigger / "labels" / "train" / "000011.txt").read_bytes() == (
        shapes / "labels" / "train" / "000011.txt"
    ).read_bytes()


def test_images_and_labels_are_valid_and_agree(shapes: Path) -> None:
    result = load_labels(find_images(shapes / "images" / "train"))
    assert result.counts == {"found": 12, "missing": 0, "empty": 0, "corrupt": 0, "duplicates": 0}
    assert result.shapes.min() >= 256 and result.shapes.max() <= 384
    assert len({tuple(s) for s in result.shapes}) > 1, "aspect ratios vary"
    all_labels = np.concatenate(result.labels)
    assert set(all_labels[:, 0].astype(int)) <= set(range(len(DEFAULT_CLASSES)))
    assert all_labels[:, 1:].min() >= 0 and all_labels[:, 1:].max() <= 1
    sides = all_labels[:, 3:5] * np.repeat(result.shapes, [len(lb) for lb in result.labels], axis=0)
    assert sides.min() >= 20, "objects are big enough for a small model to learn"
    # the box centre shows the class colour for nearly every object (a few may be covered)
    hits = total = 0
    for im_file, labels, (w, h) in zip(result.im_files, result.labels, result.shapes):
        img = cv2.imread(im_file).astype(int)
        for cls, xc, yc, _, _ in labels:
            pixel = img[int(yc * h), int(xc * w)]
            hits += np.abs(pixel - SHAPE_COLOURS[DEFAULT_CLASSES[int(cls)]]).max() < 60
            total += 1
    assert hits >= 0.8 * total, f"only {hits} of {total} box centres show their class colour"


def test_generate_reads_sizes_from_the_data_dict(tmp_path: Path) -> None:
    root = tmp_path / "gen"
    generate({"path": str(root), "names": {0: "star", 1: "cross"}, "n_train": 3, "n_val": 2, "size": 64, "seed": 1})
    assert len(list((root / "images" / "train").iterdir())) == 3
    assert len(list((root / "images" / "val").iterdir())) == 2
    result = load_labels(find_images(root / "images" / "val"))
    assert (result.shapes == 64).all()
    assert set(np.concatenate(result.labels)[:, 0].astype(int)) <= {0, 1}


def test_refuses_a_non_empty_root_and_bad_arguments(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("user data")
    with pytest.raises(FileExistsError, match="full"):
        make_shapes_dataset(tmp_path / "full", 1, 1)
    assert (tmp_path / "full" / "keep.txt").read_text() == "user data"
    with pytest.raises(ValueError, match="hexagon"):
        make_shapes_dataset(tmp_path / "x", 1, 1, classes=("circle", "hexagon"))
    with pytest.raises(ValueError, match="size"):
        make_shapes_dataset(tmp_path / "x", 1, 1, size=(300, 200))
    (tmp_path / "empty").mkdir()
    assert make_shapes_dataset(tmp_path / "empty", 1, 1) == tmp_path / "empty"


def test_interrupted_generation_leaves_nothing_that_looks_complete(tmp_path: Path, monkeypatch) -> None:
    calls = {"n": 0}
    real = synthetic._draw_image

    def fail_midway(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt  # what Ctrl-C during generation raises
        return real(*args, **kwargs)

    monkeypatch.setattr(synthetic, "_draw_image", fail_midway)
    with pytest.raises(KeyboardInterrupt):
        make_shapes_dataset(tmp_path / "shapes", 5, 2)
    assert list(tmp_path.iterdir()) == []
