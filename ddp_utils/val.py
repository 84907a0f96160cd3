"""``python -m ddp_utils.val --weights best.pt --data X.yaml``: see :mod:`ddp_utils.cli.val`."""

import sys

from .cli.val import main

if __name__ == "__main__":
    sys.exit(main())
