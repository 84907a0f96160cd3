"""Datasets in the YOLO format, from the data yaml to the batches of each rank.

What lives where:

- ``config.py``: the data yaml (load, resolve paths, check); ``download.py``: fetching a dataset its
  yaml names (zip URLs, trusted generators).
- ``labels.py``: find images and verify their labels, ``load_labels``; ``label_cache.py``: the label
  cache (versioned, hashed, pickle-free).
- ``headers.py``: image sizes from file headers, without decoding.
- ``images.py``: read, decode and resize one image; ``image_cache.py``: the image caches (RAM: one
  copy per node; disk: .npy); ``decoder_text.py``: a decoder's own words (OpenCV's codecs on stderr,
  PIL's warnings) caught around the call, for a line that names the file.
- ``augment.py``: letterbox, HSV, flips, mixup; ``warp.py``: the mosaic and the random perspective;
  ``geometry.py``: their numbers (the random transform, where tiles and boxes land), without pixels.
- ``mosaic_batch.py``: a training batch's mosaics made together (the same samples as one by one, faster).
- ``device/``: the device path (``--augment-on device``), one concern: the recipes the workers send, the
  decode, the render's plan, its kernels and their slow reference, the loader thread and the transfer
  (:mod:`ddp_utils.data.device`).
- ``dataset.py``: :class:`YoloDataset` (with YOLOv5's attribute names), rect batch shapes, collate functions.
- ``class_weights.py``: class and image weights from the labels (YOLOv5's ``--image-weights``).
- ``samplers.py``: train, weighted-train and exactly-once eval samplers, one guarantee per class.
- ``workers.py``: what runs at loader-worker start (seeding, allocator, OpenCV threads, SIGTERM),
  and how many workers a process gets.
- ``transfer.py``: batches back from the workers through reused shared-memory slots.
- ``loader.py``: :func:`create_dataloader`, :func:`create_val_dataloader` and :class:`EpochLoader`,
  whose workers stay across epochs.
- ``synthetic.py``: an offline synthetic detection dataset (the default data).

The box conversions the pipeline uses live in :mod:`ddp_utils.boxes`.
"""

from ..downloads import DownloadError
from ..hyp import hyp_value, load_hyp  # the hyperparameter yaml, read by the data pipeline too
from ..yamls import DataConfigError
from .augment import letterbox
from .class_weights import class_frequency, epoch_image_weights, labels_to_class_weights, labels_to_image_weights
from .config import check_dataset, datasets_dir
from .dataset import SampleKey, YoloDataset, rect_batch_shapes
from .device import (
    DevicePrefetcher,
    augment_choice,
    augment_place,
    images_to_float,
    render_batch,
    renderer_for,
    to_device_batch,
)
from .images import load_image
from .labels import IMG_FORMATS, LabelSet, find_images, img2label_paths, label_cache_path, load_labels
from .loader import EpochLoader, create_dataloader, create_val_dataloader
from .samplers import EvalSampler, TrainSampler, WeightedTrainSampler
from .synthetic import generate, make_shapes_dataset

__all__ = [
    "IMG_FORMATS",
    "DataConfigError",
    "DevicePrefetcher",
    "DownloadError",
    "EpochLoader",
    "EvalSampler",
    "LabelSet",
    "SampleKey",
    "TrainSampler",
    "WeightedTrainSampler",
    "YoloDataset",
    "augment_choice",
    "augment_place",
    "check_dataset",
    "create_dataloader",
    "create_val_dataloader",
    "datasets_dir",
    "find_images",
    "generate",
    "hyp_value",
    "images_to_float",
    "img2label_paths",
    "label_cache_path",
    "class_frequency",
    "labels_to_class_weights",
    "labels_to_image_weights",
    "epoch_image_weights",
    "letterbox",
    "load_image",
    "load_hyp",
    "load_labels",
    "make_shapes_dataset",
    "rect_batch_shapes",
    "render_batch",
    "renderer_for",
    "to_device_batch",
]
