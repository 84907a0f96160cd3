"""A user's mistake under a launcher: one line on the console, the cause in torchrun's report, exit code 2.

Under ``torchrun`` every rank meets the same bad option or missing file. Printed by each, the
line would repeat once per process; and torchrun, seeing a worker exit non-zero, prints its
``ChildFailedError`` report, whose "Root Cause" says only "To enable traceback see ..." unless
the worker left a message in its *error file*: the JSON file that torchrun names to each worker in
``TORCHELASTIC_ERROR_FILE`` (the mechanism of torch's
``torch.distributed.elastic.multiprocessing.errors.record``).

:func:`exit_usage_error` does both: it writes the message to this worker's error file (every
rank, so whichever rank torchrun sees fail first is named with the cause; a follower's dated at its
exit after the grace, so that the root cause is a node's first process, with its own exit code, not
a follower that torchrun stopped), prints it on the first process of each node only (one line per
node's console; one line in all on a single machine), and exits with :data:`USAGE_EXIT_CODE` (2, as
argparse) or the caller's code. A single process prints it and exits 2.
What the user's shell gets under torchrun is torchrun's own exit code, 1, whatever the workers' codes;
its report shows the worker's ``exitcode: 2`` and the message.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

from ..log import LOGGER
from .env import DistEnvError, dist_info

USAGE_EXIT_CODE = 2  # argparse's code for a usage error
# How long a process other than its node's first lingers before exiting on a user's mistake. The first process meets
# the same mistake at about the same point and says it; a follower that exits at once makes torchrun's agent end the
# first one (SIGTERM) before it could, on a loaded host, and the console would show the mistake only inside
# torchrun's report.
FOLLOWER_EXIT_GRACE_S = 5.0
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"  # set by torchrun for each worker


def record_error_for_launcher(
    message: str, environ: dict[str, str] | None = None, at: float | None = None
) -> Path | None:
    """Write ``message`` to this worker's torchrun error file, so torchrun's failure report names it.

    The file holds what torch's ``record`` writes for an exception, minus the traceback:
    ``{"message": {"message": ..., "extraInfo": {"timestamp": ...}}}``; torchrun's report then
    shows the message where it would show "To enable traceback see ...".

    Args:
        message: the one-line cause.
        environ: the environment to read ``TORCHELASTIC_ERROR_FILE`` from (default ``os.environ``).
        at: the failure's time (seconds since the epoch; default now). torchrun names the failure with the earliest
            time its "Root Cause", whatever the order the workers ended in.

    Returns:
        The file written, or None outside torchrun (no such variable) or when it cannot be written.

    Examples:
        >>> import json, tempfile
        >>> path = Path(tempfile.mkdtemp()) / "error.json"
        >>> record_error_for_launcher("train.py: error: no x.yaml", {ERROR_FILE_ENV: str(path)}) == path
        True
        >>> json.loads(path.read_text())["message"]["message"]
        'train.py: error: no x.yaml'
        >>> record_error_for_launcher("no launcher", {}) is None
        True
    """
    environ = os.environ if environ is None else environ
    target = environ.get(ERROR_FILE_ENV)
    if not target:
        return None
    data = {"message": {"message": message, "extraInfo": {"timestamp": str(int(time.time() if at is None else at))}}}
    try:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(json.dumps(data), encoding="utf-8")
    except OSError as exc:
        LOGGER.debug(f"could not write torchrun's error file {target}: {exc}")
        return None
    return Path(target)


def exit_usage_error(message: str, code: int = USAGE_EXIT_CODE) -> NoReturn:
    """Report a user's mistake once per node, leave it in torchrun's error file, and exit with ``code``.

    Args:
        message: one line naming the value or file at fault and what to do (e.g. ``"train.py: error:
            --batch-size 3 does not divide by WORLD_SIZE=2: use a multiple of 2"``).
        code: the exit code (2, as argparse, unless the caller says otherwise).

    Raises:
        SystemExit: always, with ``code``.

    Examples:
        >>> try:
        ...     exit_usage_error("demo: error: --epochs 0: train at least one epoch")
        ... except SystemExit as exc:
        ...     exc.code
        2
    """
    try:
        first_of_node = dist_info().is_local_main
    except DistEnvError:  # the launcher's variables are what is wrong: say it here
        first_of_node = True
    # a follower's failure dated at its exit, after the grace: torchrun's "Root Cause" is then the process that says
    # the line and exits now, with its own code (dated now, a follower that wrote its file a moment before the first
    # process did was named, with the -15 of the SIGTERM that ended its grace)
    record_error_for_launcher(message, at=time.time() + (0.0 if first_of_node else FOLLOWER_EXIT_GRACE_S))
    if first_of_node:  # the same mistake on every rank: say it once per node's console
        LOGGER.error(message)
        for handler in LOGGER.handlers:
            handler.flush()
        sys.stderr.flush()
    else:
        time.sleep(FOLLOWER_EXIT_GRACE_S)  # the first process says it, then its exit ends this one (torchrun)
    sys.exit(code)
