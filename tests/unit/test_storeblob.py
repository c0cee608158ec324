"""Values of any size in the run's store (executor/core/storeblob.py), on a real TCPStore,
whose libuv backend refuses a single value over 8 MiB."""

from __future__ import annotations

import os

from edgepipe.executor.core import storeblob
from edgepipe.executor.ft.control import host_store


def test_a_value_over_the_stores_cap_goes_in_chunks_and_comes_back_whole() -> None:
    store = host_store(0)
    value = os.urandom(2 * storeblob.CHUNK_BYTES + 5)  # 8 MiB + 5 bytes: 3 chunks
    storeblob.put(store, "gen1/ckpt/2/0", value)
    assert store.get("gen1/ckpt/2/0") == b"3"
    assert [len(store.get(f"gen1/ckpt/2/0/{i}")) for i in range(3)] == [
        storeblob.CHUNK_BYTES, storeblob.CHUNK_BYTES, 5]
    assert storeblob.get(store, "gen1/ckpt/2/0") == value


def test_an_empty_value_is_no_chunk_and_deleting_frees_every_key() -> None:
    store = host_store(0)
    storeblob.put(store, "empty", b"")
    assert store.get("empty") == b"0"
    assert storeblob.get(store, "empty") == b""
    storeblob.put(store, "small", b"abc")
    storeblob.delete(store, "small")
    storeblob.delete(store, "empty")
    assert not store.check(["small"]) and not store.check(["small/0"])
    assert not store.check(["empty"])


def test_discard_frees_a_whole_value_a_put_cut_short_and_a_missing_key_at_once() -> None:
    store = host_store(0)
    storeblob.put(store, "whole", os.urandom(storeblob.CHUNK_BYTES + 1))  # 2 chunks
    store.set("cut/0", b"x")  # a writer that died after its first chunk
    store.set("cut/1", b"y")
    storeblob.put(store, "other", b"kept")
    before = store.num_keys()
    for key in ("whole", "cut", "missing"):  # none of them waits for a key
        storeblob.discard(store, key)
    assert store.num_keys() == before - 5
    assert storeblob.get(store, "other") == b"kept"
