"""ddp_utils.distributed.store: a private connection to a c10d store, and calls bounded by a deadline.

A host that accepts connections (the kernel does it) but never answers is what a SIGSTOPped store
host looks like to its clients: a plain listening socket plays it here, in-process.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from ddp_utils.distributed.store import BoundedStore, StoreLostError, private_connection, store_address


@pytest.fixture
def server():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))


def test_a_call_to_a_host_that_never_answers_is_given_up_at_its_deadline():
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        port = mute.getsockname()[1]

        def connect() -> dist.TCPStore:  # the store's own timeout (30 s) bounds no such call: the deadline does
            return dist.TCPStore(
                "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30)
            )

        link = BoundedStore(connect, timeout=1.0)
        start = time.monotonic()
        with pytest.raises(StoreLostError, match="no answer within 1 s"):
            link.call(lambda store: store.add("visits", 1))
        assert time.monotonic() - start < 5
        with pytest.raises(StoreLostError):  # lost for good: the next call does not wait again
            link.call(lambda store: store.add("visits", 1), timeout=30)
        assert time.monotonic() - start < 5


def test_a_failing_call_marks_the_store_lost_naming_the_error(server):
    link = BoundedStore(lambda: private_connection(server), timeout=10)
    assert link.call(lambda store: store.add("n", 3)) == 3

    def broken(store):
        raise ConnectionResetError("peer went away")

    with pytest.raises(StoreLostError, match="ConnectionResetError: peer went away"):
        link.call(broken)
    assert link.lost == "ConnectionResetError: peer went away"
    link.close()


def test_a_private_connection_without_clone_reaches_the_same_store_below_its_prefixes(server):
    class OldPrefixStore:  # a torch without Store.clone: only the way down to the TCPStore
        underlying_store = dist.PrefixStore("attempt0", server)

    connection = private_connection(OldPrefixStore())
    assert connection is not server and isinstance(connection, dist.TCPStore)
    connection.set("from/thread", "1")
    assert server.get("from/thread") == b"1"
    assert store_address(OldPrefixStore()) == f"127.0.0.1:{server.port}"
    cloned = private_connection(dist.PrefixStore("attempt0", server))  # with clone: the prefix is kept
    cloned.set("k", "v")
    assert server.get("attempt0/k") == b"v"
