"""Datasets in the YOLO format: data yamls, labels and their cache, the synthetic default dataset."""

from .config import DataConfigError, check_dataset, datasets_dir, load_hyp
from .labels import IMG_FORMATS, LabelSet, find_images, img2label_paths, label_cache_path, load_labels
from .synthetic import generate, make_shapes_dataset

__all__ = [
    "IMG_FORMATS",
    "DataConfigError",
    "LabelSet",
    "check_dataset",
    "datasets_dir",
    "find_images",
    "generate",
    "img2label_paths",
    "label_cache_path",
    "load_hyp",
    "load_labels",
    "make_shapes_dataset",
]
