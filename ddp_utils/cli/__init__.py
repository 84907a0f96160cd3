"""Command-line entry points, on top of the library: ``python -m ddp_utils <command>`` runs them
(``ddp_utils/__main__.py``), and so do the console scripts ``ddp-<command>``.

- ``val.py``: ``python -m ddp_utils val --weights best.pt --data X.yaml`` (also under torchrun), a
  checkpoint scored without training: YOLOv5 val's per-class table, speed line and COCO predictions json.
- ``convert.py``: ``python -m ddp_utils convert yolov5s.pt [out.pt]``, a YOLOv5 checkpoint read
  without running it (:mod:`ddp_utils.yolo.foreign`) and written in ddp_utils' plain-data format.
- ``profile.py``: ``python -m ddp_utils profile``, a model's summary, FLOPs and per-device
  forward/backward time (functions in :mod:`ddp_utils.profiling`).

Each module has ``main(argv, prog)``; nothing below ``cli/`` imports from it.
"""
