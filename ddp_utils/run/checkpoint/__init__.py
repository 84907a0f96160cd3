"""The checkpoint file: its format, atomic writing, pickle-free reading (ours or YOLOv5's), stripping.

A checkpoint is a dict of plain values, so ``torch.load(..., weights_only=True)`` reads it
and a file from the internet cannot run code on load. :func:`build_checkpoint` makes one:

    ============== =============================================================
    key            value
    ============== =============================================================
    model          EMA (or model) ``state_dict()``: fp32 tensors, fp16 after
                   :func:`strip_optimizer`
    train_model    the raw training weights beside the EMA's, so a resumed run continues
                   exactly, or None; dropped by :func:`strip_optimizer`
    model_cfg      the model yaml as a dict (rebuild with ``Model(ckpt["model_cfg"])``)
    optimizer      ``optimizer.state_dict()``, or None after :func:`strip_optimizer`
    scaler         ``GradScaler.state_dict()`` or None
    ema_updates    ``ModelEMA.updates`` (int)
    epoch          the last finished epoch (int); -1 once stripped (not resumable)
    best_fitness   best fitness so far (float)
    opt            the run's options as a dict of plain values (Paths become str)
    hyp            the hyperparameter dict
    train_state    where training stands, so a resume continues at the next batch
                   (:class:`~ddp_utils.run.train_state.TrainState`'s dict), or None;
                   dropped by :func:`strip_optimizer`
    date           ISO 8601 time of saving (UTC)
    version        the ddp_utils version that wrote it
    ============== =============================================================

Writing: :func:`atomic_torch_save` and :func:`atomic_write_bytes` leave either the old file or
the whole new one; :class:`BackgroundWriter` does the serialising and writing in a thread, in
order, after the caller copied the state to host memory (:func:`to_host`). Reading:
:func:`load_checkpoint` (``weights_only``), :func:`load_pretrained` (ours, or YOLOv5's read
without running its pickle). :func:`strip_optimizer` makes the final, smaller file.
:class:`Checkpointer` owns a run's files (``last.pt``, ``best.pt``, ``epochN.pt``); what a resume
reads back, and how, is in :mod:`ddp_utils.run.resume`.

- ``format.py``: the keys, plain values (:func:`to_plain`, :func:`check_plain`), :func:`build_checkpoint`,
  :func:`to_host`; the errors.
- ``disk.py``: the file on disk: atomic and background writes, :func:`save_checkpoint`, :func:`load_checkpoint`.
- ``integrity.py``: :func:`check_integrity` (cut short, or bytes changed: every record against its
  CRC-32), :func:`last_good_checkpoint` (a run's furthest file that is whole and resumes).
- ``strip.py``: :func:`strip_optimizer`, ours and YOLOv5's layout.
- ``pretrained.py``: :func:`load_pretrained`, :func:`convert_yolov5_checkpoint`.
- ``checkpointer.py``: :class:`Checkpointer`.
"""

from .checkpointer import Checkpointer
from .disk import (
    BackgroundWriter,
    atomic_torch_save,
    atomic_write_bytes,
    load_checkpoint,
    save_checkpoint,
)
from .format import (
    CHECKPOINT_KEYS,
    CheckpointError,
    CheckpointWriteError,
    UnsafeCheckpointError,
    build_checkpoint,
    check_plain,
    to_host,
    to_plain,
)
from .integrity import DamagedCheckpointError, check_integrity, last_good_checkpoint
from .pretrained import (
    FOREIGN_KEY,
    convert_yolov5_checkpoint,
    foreign_resume_message,
    load_pretrained,
    yolov5_to_checkpoint,
)
from .strip import strip_optimizer

__all__ = [
    "CHECKPOINT_KEYS",
    "FOREIGN_KEY",
    "BackgroundWriter",
    "CheckpointError",
    "CheckpointWriteError",
    "Checkpointer",
    "DamagedCheckpointError",
    "UnsafeCheckpointError",
    "atomic_torch_save",
    "atomic_write_bytes",
    "build_checkpoint",
    "check_integrity",
    "check_plain",
    "convert_yolov5_checkpoint",
    "foreign_resume_message",
    "last_good_checkpoint",
    "load_checkpoint",
    "load_pretrained",
    "save_checkpoint",
    "strip_optimizer",
    "to_host",
    "to_plain",
    "yolov5_to_checkpoint",
]
