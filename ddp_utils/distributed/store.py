"""The process group's c10d store, and a connection to it that a thread can use with deadlines of its own.

The store the group formed over (the TCPStore that rank 0 hosts under a plain ``env://`` launch, or
torchrun's agent store seen through a prefix per restart) carries small messages between ranks
outside collectives: :mod:`zero_first`'s sections and :mod:`watchdog`'s progress reports.

What is safe to share, found on torch 2.14's TCPStore:

- Each client serialises its calls with a mutex of its own, so two threads may use one client
  without garbling its messages.
- But a call whose reply never comes holds that mutex. When the store's host is *stopped*
  (SIGSTOP, a hang in the kernel) rather than dead, ``get``, ``add``, ``check``, ``wait`` and
  ``multi_get`` block until the host goes away, however short the store's timeout: the timeout
  bounds only the wait for a key to appear, not the wait for the host's answer. ``set`` expects
  no answer and returns. A dead host resets the connection and the call raises at once.

So a thread that must keep its own pace whatever the store does (the stall watchdog) never
shares the main thread's client: :class:`BoundedStore` opens a private connection
(``Store.clone()`` where torch has it, else a new TCPStore client to the same host and port)
and runs every call on a helper thread, waiting for it with a deadline; a call past its
deadline marks the store lost (the helper may stay blocked for good: it is a daemon).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

T = TypeVar("T")


class StoreLostError(RuntimeError):
    """The store gave no answer within a deadline, or its connection failed."""


def default_store() -> Any | None:
    """The store of the default process group, or None (no group, or a torch without it)."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:  # a torch without it, or a group without a store
        return None


def base_store(store: Any) -> Any:
    """The store below every PrefixStore around ``store``."""
    seen = 0
    while seen < 16 and hasattr(store, "underlying_store"):
        store, seen = store.underlying_store, seen + 1
    return store


def store_address(store: Any) -> str:
    """``host:port`` of a TCPStore below ``store``, else its type's name: for messages."""
    base = base_store(store)
    host, port = getattr(base, "host", None), getattr(base, "port", None)
    return f"{host}:{port}" if host is not None else type(base).__name__


def private_connection(store: Any, timeout: float = 60.0) -> Any:
    """A new client of the same store as ``store``, for one thread's use.

    ``Store.clone()`` keeps every prefix; without it (older torch) a new TCPStore client to the
    host and port below the prefixes serves, and keys then sit at the store's top level.

    Raises:
        StoreLostError: neither works (a FileStore on a torch without ``clone``), or connecting failed.
    """
    clone = getattr(store, "clone", None)
    if clone is not None:
        try:
            return clone()
        except Exception as exc:  # a store type without an implementation: try the TCP way
            first_error: Exception | None = exc
    else:
        first_error = None
    base = base_store(store)
    if not (hasattr(base, "host") and hasattr(base, "port")):
        raise StoreLostError(f"cannot open a second connection to a {type(base).__name__}: {first_error}")
    import torch.distributed as dist

    try:
        return dist.TCPStore(
            base.host, base.port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=timeout)
        )
    except Exception as exc:
        raise StoreLostError(f"cannot connect to the store at {base.host}:{base.port}: {exc}") from exc


class BoundedStore:
    """Calls on a private connection to a store, each waited for with a deadline.

    One daemon thread opens the connection (``connect()``, on its first call) and runs the calls
    in order; :meth:`call` waits for each up to its deadline. A call that misses it, or raises,
    marks the store lost: that call and every later one raise :class:`StoreLostError`.

    Args:
        connect: returns the connection (e.g. ``lambda: private_connection(default_store())``).
        timeout: default seconds a call may take.
        name: the helper thread's name.

    Examples:
        >>> import torch.distributed as dist
        >>> server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        >>> link = BoundedStore(lambda: private_connection(server), timeout=10.0)
        >>> link.call(lambda store: store.add("visits", 2))
        2
        >>> link.close()
    """

    def __init__(self, connect: Callable[[], Any], timeout: float, name: str = "ddp_utils-store") -> None:
        self.timeout = timeout
        self.lost: str | None = None  # why the store counts as lost, once it does
        self._connect = connect
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        connection = None
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, box, done = job
            try:
                if connection is None:
                    connection = self._connect()
                box.append((True, fn(connection)))
            except BaseException as exc:
                box.append((False, exc))
            done.set()

    def call(self, fn: Callable[[Any], T], timeout: float | None = None) -> T:
        """``fn(connection)``, waited for at most ``timeout`` seconds (default: the link's).

        Raises:
            StoreLostError: the store is lost, or is lost now: no answer in time, or an error.
        """
        if self.lost is not None:
            raise StoreLostError(self.lost)
        seconds = self.timeout if timeout is None else timeout
        box: list = []
        done = threading.Event()
        self._jobs.put((fn, box, done))
        if not done.wait(seconds):
            self.lost = f"no answer within {seconds:g} s"
            raise StoreLostError(self.lost)
        ok, value = box[0]
        if not ok:
            self.lost = f"{type(value).__name__}: {value}".strip()
            raise StoreLostError(self.lost) from value
        return value

    def close(self) -> None:
        """Let the helper thread end once its current call (if any) returns."""
        self._jobs.put(None)
