"""Values of any size in a ``torch.distributed`` store, in chunks.

The run's ``TCPStore`` (libuv backend, torch 2.13) refuses a value over 8 MiB ("Invalid
payload size ... max: 8388608") and drops the client's connection. What travels from
the workers to the coordinator and back without a shared file system - checkpoint
parts, a checkpoint to resume from, re-planned plans - can be larger, so it goes as
chunks of ``CHUNK_BYTES``: ``<key>/<i>`` for ``i = 0 .. n-1``, then ``<key>`` = ``n``
(written last, so ``store.check([key])`` means every chunk is in).

Cost: ``ceil(size / CHUNK_BYTES) + 1`` store round trips each way.
"""

from __future__ import annotations

from torch.distributed import Store

#: chunk size, well under the store's 8 MiB payload cap
CHUNK_BYTES = 4 * 2**20


def put(store: Store, key: str, value: bytes) -> None:
    """Store ``value`` under ``key`` (module docstring); ``key`` is written last."""
    chunks = range(0, len(value), CHUNK_BYTES)
    for i, start in enumerate(chunks):
        # torch's stub says str, but Store.set takes bytes as they are (pybind11 std::string)
        store.set(f"{key}/{i}", value[start:start + CHUNK_BYTES])  # type: ignore[arg-type]
    store.set(key, str(len(chunks)))


def get(store: Store, key: str) -> bytes:
    """The value :func:`put` stored under ``key`` (waits for ``key`` up to the store's
    timeout)."""
    n = int(store.get(key))
    return b"".join(store.get(f"{key}/{i}") for i in range(n))


def delete(store: Store, key: str) -> None:
    """Free the chunks of ``key`` and ``key`` itself."""
    n = int(store.get(key))
    for i in range(n):
        store.delete_key(f"{key}/{i}")
    store.delete_key(key)


def discard(store: Store, key: str) -> None:
    """Free whatever :func:`put` wrote of ``key``, also of a put cut short (chunks
    without their count) or never begun; waits for nothing (``delete_key`` says whether
    a key was there)."""
    i = 0
    while store.delete_key(f"{key}/{i}"):
        i += 1
    store.delete_key(key)
