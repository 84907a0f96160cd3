"""Datasets in the YOLO format: data yamls, labels and their cache, the synthetic default dataset."""

from .augment import letterbox
from .config import DataConfigError, DownloadError, check_dataset, datasets_dir, load_hyp
from .dataset import SampleKey, YoloDataset
from .images import load_image
from .labels import IMG_FORMATS, LabelSet, find_images, img2label_paths, label_cache_path, load_labels
from .loader import EpochLoader, EpochSampler, create_dataloader, create_val_dataloader
from .synthetic import generate, make_shapes_dataset

__all__ = [
    "IMG_FORMATS",
    "DataConfigError",
    "DownloadError",
    "EpochLoader",
    "EpochSampler",
    "LabelSet",
    "SampleKey",
    "YoloDataset",
    "check_dataset",
    "create_dataloader",
    "create_val_dataloader",
    "datasets_dir",
    "find_images",
    "generate",
    "img2label_paths",
    "label_cache_path",
    "letterbox",
    "load_image",
    "load_hyp",
    "load_labels",
    "make_shapes_dataset",
]
