"""Run metrics: what each rank reports per step, and the JSON-lines files of a run.

A run directory holds ``plan.json`` (the plan as run), ``ranks.json`` (rank -> device,
stage, pid; written by the local launcher), ``metrics.jsonl``, ``timeline.jsonl`` and
``transfers.jsonl`` (format in docs/executor.md). Ranks publish one small JSON payload
per step on the run's store; a thread of rank 0 merges them into one metrics line per
step (in step order) and the timeline lines (appended to when a run resumes from a
checkpoint). Reading these files needs no torch.

Per-device figures of a step: ``compute_ms`` (F + B), ``send_ms`` (posting sends and
waiting for them at the end of the step), ``recv_wait_ms`` (waiting for activations and
gradients), ``allreduce_ms`` (REDUCE_GRAD), ``optim_ms``, ``wall_ms`` (the rank's step:
from the start of its first action, once its rows are loaded, to the end of its
optimizer step, the commit point between them included), ``started_at`` (the wall clock
at that start; step periods, replication included, are differences of it),
``peak_mem_bytes`` (CUDA: peak allocated; CPU: the process's peak resident set size,
which includes the interpreter and torch) and, on CPU, ``baseline_mem_bytes`` (the
peak resident set size when this module was imported: interpreter, torch and edgepipe
loaded, no model built yet; :data:`BASELINE_MEM_BYTES`).
The step's ``wall_ms`` is the largest rank's, ``samples_per_s`` the global batch over it.

**Transfers** (docs/executor.md, "transfers.jsonl"): each payload carries its rank's
stamped pieces (:mod:`executor.core.comm`, "Transfer times"); the writer matches each
send to its receive (sender, receiver and tag are unique within a step) and writes one
``TRANSFER_F`` (activations) or ``TRANSFER_B`` (gradients) line per piece to
``transfers.jsonl`` (its own file: readers of a device's actions in ``timeline.jsonl``
find them in time order, as before),
times in ms from the *sender's* step start on the shared wall clock: ``start_ms`` the
post, ``end_ms`` the receiver's completion, ``waited_ms`` when the receiver began
waiting for it, ``recv_posted_ms`` when the receiver posted it (for a receive
stamped by an older writer, which posted at the wait: ``waited_ms``). A piece without
its other half (a payload of an older writer) is left out.
Deterministic-mode loss: ``L = l_0.clone(); L.add_(l_i) ...; L.div_(B)`` over the
per-sample losses in global position order (DETERMINISTIC.md); fast mode: the sum of the
last stage's scaled slice losses in rank order.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import Any

import torch
from edgepipe.executor.core.comm import tag_parts
from edgepipe.executor.core.layout import RankLayout
from edgepipe.executor.core.runtime import StepRecord
from edgepipe.planner.check.live import complete_lines

COMPUTE = ("F", "B")
SEND = ("SEND_F", "SEND_B", "SEND_WAIT")
RECV = ("RECV_F", "RECV_B")
#: per-device figures that payloads of older writers, or of runs without replication, lack
OPTIONAL = ("started_at", "replication_ms", "replication_background_ms", "replication_point",
            "replication_acked_at", "baseline_mem_bytes")
#: decimals of a transfer stamp's wall-clock seconds (microseconds)
STAMP_DECIMALS = 6


def _peak_rss_bytes() -> int:
    """This process's peak resident set size: ``VmHWM`` of /proc/self/status, the
    high-water mark of its own address space. Not ``ru_maxrss``: Linux carries that
    across fork and exec, so a spawned worker would report its launcher's peak when the
    launcher is the larger (a 600 MiB parent's child read 614 MiB)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


#: this process's peak resident set size when this module was imported (module docstring)
BASELINE_MEM_BYTES = _peak_rss_bytes()


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return _peak_rss_bytes()


def rank_payload(record: StepRecord, device: torch.device) -> dict[str, Any]:
    """The JSON-able summary of one rank's step that it publishes."""
    return {
        "step": record.step,
        "losses": record.losses,
        "loss_sum": record.loss_sum,
        "compute_ms": record.total(*COMPUTE),
        "send_ms": record.total(*SEND),
        "recv_wait_ms": record.total(*RECV),
        "allreduce_ms": record.total("REDUCE_GRAD"),
        "optim_ms": record.total("OPTIM"),
        "wall_ms": record.wall_ms,
        "started_at": record.started_at,
        "peak_mem_bytes": peak_memory_bytes(device),
        **({} if device.type == "cuda" else {"baseline_mem_bytes": BASELINE_MEM_BYTES}),
        "intervals": [
            [i.kind, i.micro_batch, round(i.start_ms, 4), round(i.end_ms, 4)]
            for i in record.intervals
        ],
        "transfers": [
            [kind, peer, tag, *(round(t, STAMP_DECIMALS) for t in times)]
            for kind, peer, tag, *times in record.transfers
        ],
    }


def transfer_lines(step: int, layout: RankLayout, payloads: list[dict[str, Any]]
                   ) -> list[dict[str, Any]]:
    """The ``TRANSFER_F`` / ``TRANSFER_B`` lines of one step (module docstring),
    in sender rank order, then in posting order. O(pieces)."""
    received = {
        (peer, rank, tag): (waited, done, posted[0] if posted else waited)
        for rank, p in enumerate(payloads)
        for _, peer, tag, waited, done, *posted in (s for s in p.get("transfers", ())
                                                    if s[0] == "recv")
    }
    lines = []
    for rank, p in enumerate(payloads):
        src = layout.ranks[rank]
        for _, peer, tag, posted in (s for s in p.get("transfers", ()) if s[0] == "send"):
            if (rank, peer, tag) not in received or "started_at" not in p:
                continue
            waited, done, recv_posted = received[(rank, peer, tag)]
            m, forward = tag_parts(tag)
            start, end, wait, ready = ((t - p["started_at"]) * 1e3
                                       for t in (posted, done, waited, recv_posted))
            lines.append({
                "device": src.device, "rank": rank, "stage": src.stage, "step": step,
                "kind": "TRANSFER_F" if forward else "TRANSFER_B", "micro_batch": m,
                "peer": layout.ranks[peer].device, "peer_rank": peer,
                "start_ms": round(start, 4), "end_ms": round(end, 4),
                "waited_ms": round(wait, 4), "recv_posted_ms": round(ready, 4),
            })
    return lines


def step_loss(payloads: list[dict[str, Any]], global_batch: int, deterministic: bool) -> float:
    """The step's loss from every rank's payload (module docstring)."""
    if deterministic:
        per_position = dict(pos_loss for p in payloads for pos_loss in p["losses"])
        if sorted(per_position) != list(range(global_batch)):
            raise RuntimeError(f"losses of positions {sorted(per_position)} reported")
        total = torch.tensor(per_position[0], dtype=torch.float32)
        for i in range(1, global_batch):
            total.add_(torch.tensor(per_position[i], dtype=torch.float32))
        total.div_(global_batch)
        return float(total)
    return float(sum(p["loss_sum"] for p in payloads if p["loss_sum"] is not None))


class MetricsWriter:
    """Appends merged step lines to ``metrics.jsonl``, ``timeline.jsonl`` and
    ``transfers.jsonl``, each step's flushed as it is written, so a reader sees every
    step written so far (a run still going, or one that died). :meth:`rollback` takes
    the lines of steps from a given one on out of the three files again (a recovering
    run's replay); it keeps the other lines (``"type"``) written after them."""

    def __init__(
        self, out_dir: Path, layout: RankLayout, deterministic: bool, append: bool = False
    ) -> None:
        self.layout = layout
        self.deterministic = deterministic
        out_dir.mkdir(parents=True, exist_ok=True)
        mode = "a" if append else "w"
        self.metrics = (out_dir / "metrics.jsonl").open(mode)
        self.timeline = (out_dir / "timeline.jsonl").open(mode)
        self.transfers = (out_dir / "transfers.jsonl").open(mode)
        #: step -> where its lines begin in (metrics, timeline, transfers): what a
        #: rollback cuts
        self._offsets: dict[int, tuple[int, int, int]] = {}

    def write_step(
        self, step: int, payloads: list[dict[str, Any]], extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Merge one step's payloads (index = rank) and write its lines (``extra``: more
        keys of the metrics line); returns the metrics line."""
        wall = max(p["wall_ms"] for p in payloads)
        self._offsets[step] = (self.metrics.tell(), self.timeline.tell(),
                               self.transfers.tell())
        devices = {}
        for info, p in zip(self.layout.ranks, payloads, strict=True):
            devices[info.device] = {
                "rank": info.rank,
                "stage": info.stage,
                **{k: p[k] for k in ("compute_ms", "send_ms", "recv_wait_ms", "allreduce_ms",
                                     "optim_ms", "wall_ms", "peak_mem_bytes")},
                **{k: p[k] for k in OPTIONAL if k in p},
            }
            for kind, m, start, end in p["intervals"]:
                self.timeline.write(
                    json.dumps(
                        {
                            "device": info.device,
                            "rank": info.rank,
                            "stage": info.stage,
                            "step": step,
                            "kind": kind,
                            "micro_batch": m,
                            "start_ms": start,
                            "end_ms": end,
                        }
                    )
                    + "\n"
                )
        for t in transfer_lines(step, self.layout, payloads):
            self.transfers.write(json.dumps(t) + "\n")
        line = {
            "step": step,
            "loss": step_loss(payloads, self.layout.global_batch, self.deterministic),
            "wall_ms": wall,
            "samples_per_s": self.layout.global_batch / wall * 1e3 if wall > 0 else None,
            "devices": devices,
            **(extra or {}),
        }
        self.metrics.write(json.dumps(line) + "\n")
        self.metrics.flush()
        self.timeline.flush()
        self.transfers.flush()
        return line

    def write_event(self, event: dict[str, Any]) -> None:
        """A line that is not a step (e.g. a recovery event, ``"type": "recovery"``)."""
        self.metrics.write(json.dumps(event) + "\n")
        self.metrics.flush()

    def rollback(self, step: int) -> None:
        """Truncate the three files where the lines of ``step`` begin (nothing when no line of
        it or a later step was written), then write again the other lines (``"type"``)
        that followed; a later step's line is written again by its replay.
        O(bytes cut)."""
        cut_from = min((s for s in self._offsets if s >= step), default=None)
        if cut_from is None:
            return
        files = (self.metrics, self.timeline, self.transfers)
        for f, at in zip(files, self._offsets[cut_from], strict=True):
            f.flush()
            with open(f.name, "rb") as cut:
                cut.seek(at)
                tail = cut.read().decode().splitlines()
            f.seek(at)
            f.truncate()
            if f is self.metrics:
                f.writelines(x + "\n" for x in tail if x.strip() and "type" in json.loads(x))
            f.flush()
        self._offsets = {s: at for s, at in self._offsets.items() if s < step}

    def close(self) -> None:
        self.metrics.close()
        self.timeline.close()
        self.transfers.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The complete lines of a ``metrics.jsonl``, ``timeline.jsonl`` or
    ``transfers.jsonl`` file (of a run still going, a last line not yet terminated is
    left out: :func:`planner.check.live.complete_lines`)."""
    return complete_lines(Path(path).read_text(), str(path))
