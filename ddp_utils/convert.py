"""``python -m ddp_utils.convert yolov5s.pt [out.pt]``: see :mod:`ddp_utils.cli.convert`."""

import sys

from .cli.convert import main

if __name__ == "__main__":
    sys.exit(main())
