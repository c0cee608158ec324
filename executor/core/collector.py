"""Rank 0's metrics thread: the merged ``metrics.jsonl`` line of every step, written off
the training loop.

Each rank publishes its step payload as ``metrics/<step>/<rank>``
(:mod:`executor.core.loop`); the collector waits for every rank's payload of each step
in turn (blocking store reads on its own connection), merges and writes them
(:class:`executor.core.metrics.MetricsWriter`) and deletes the keys. O(ranks) store
reads per step.
"""

from __future__ import annotations

import json
import threading

import torch.distributed as dist
from edgepipe.executor.core.metrics import MetricsWriter


class MetricsCollector(threading.Thread):
    """Rank 0's metrics thread: waits for every rank's payload of each step in turn
    (blocking store reads on its own connection), merges and writes it, and deletes the
    keys, so the training loop never waits for metrics."""

    def __init__(
        self, store: dist.Store, writer: MetricsWriter, world_size: int, first: int, end: int
    ) -> None:
        super().__init__(name="edgepipe-metrics", daemon=True)
        self.store, self.writer = store, writer
        self.world_size, self.first, self.end = world_size, first, end
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def _get(self, key: str) -> bytes:
        while True:
            try:
                return self.store.get(key)
            except dist.DistStoreError:
                if self._stop_event.is_set():
                    raise
                # a step longer than the store timeout: keep waiting

    def run(self) -> None:
        try:
            for step in range(self.first, self.end):
                keys = [f"metrics/{step}/{r}" for r in range(self.world_size)]
                payloads = [json.loads(self._get(k)) for k in keys]
                self.writer.write_step(step, payloads)
                for k in keys:
                    self.store.delete_key(k)
        except BaseException as exc:
            self.error = exc
        finally:
            self.writer.close()

    def finish(self, timeout_s: float) -> None:
        """Wait for the last step's line (every rank has published it by now unless one
        failed); re-raise the thread's error."""
        self._stop_event.set()
        self.join(timeout_s)
        if self.is_alive():
            raise RuntimeError(f"metrics of the last step did not arrive within {timeout_s} s")
        if self.error is not None:
            raise self.error
