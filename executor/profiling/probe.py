"""Probe this machine into a device-catalog device type entry.

* **Compute.** ``peak_fp32_gflops``: the median throughput of square fp32 matmuls.
  ``efficiency``: the throughput of a real training step (forward + backward of a model's
  blocks, or of a ResNet-like 3x3 convolution when no model is given), FLOPs counted by
  ``FlopCounterMode`` over that very step, divided by the matmul figure (capped at 1).
  ``peak x efficiency`` is then the speed the planner's analytic model assumes.
* **Memory.** ``memory_bytes``: MemTotal from /proc/meminfo, or the cgroup memory limit
  when lower (containers); ``usable_fraction``: MemAvailable / MemTotal at probe time.
* **Link.** Two local ranks (``multiprocessing`` spawn context, one torch thread each)
  join a gloo group at ``tcp://127.0.0.1:<free port>`` with a short timeout and ping-pong
  a 4-byte and a large message. Latency = half the median round trip of the small one;
  bandwidth = message bits / (half the median round trip of the large one - latency).
  Where the host has two CPUs or more, the ranks are pinned to different ones: two
  ranks sharing a CPU measure the scheduler (a ~2 ms round trip here), not the link.
  The children are reaped by PID (joined, killed if still alive). On one host this
  measures the gloo stack over loopback, an upper bound for any real network link.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import queue
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from edgepipe.executor.profiling.hostinfo import cpu_model, now_iso
from edgepipe.planner.errors import EdgepipeError
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode


class ProbeError(EdgepipeError):
    """A probe could not measure what it was asked to (e.g. the link ranks failed)."""


@dataclass(frozen=True)
class LinkProbe:
    """Link figures between two local gloo ranks."""

    bandwidth_mbps: float
    latency_ms: float
    message_bytes: int


def _median_seconds(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def matmul_gflops(n: int = 2048, *, warmup: int = 2, repeats: int = 5) -> float:
    """Median fp32 GFLOP/s of an ``n x n`` by ``n x n`` matmul (2 n^3 FLOPs). O(n^3)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen)
    b = torch.randn(n, n, generator=gen)
    return 2 * n**3 / _median_seconds(lambda: a @ b, warmup, repeats) / 1e9


def train_step_gflops(
    model: nn.Module, x: torch.Tensor, *, warmup: int = 2, repeats: int = 5
) -> float:
    """GFLOP/s of ``model``'s training step (forward, then backward from a fixed random
    output gradient) on input ``x``: FLOPs counted by ``FlopCounterMode`` over one step
    (attention on the math SDPA kernel so it is counted), time = median step. The model
    is left in train mode with gradients cleared (batch-norm statistics move). O(steps)."""
    model.train()
    out = model(x)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)

    def step() -> None:
        model(x).backward(grad)

    with sdpa_kernel(SDPBackend.MATH):
        counter = FlopCounterMode(display=False)
        with counter:
            step()
    seconds = _median_seconds(step, warmup, repeats)
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / seconds / 1e9


def memory_bytes() -> tuple[int, int]:
    """(total, available) bytes of RAM: /proc/meminfo MemTotal and MemAvailable, capped by
    the cgroup (v2 or v1) memory limit when one is set; ``sysconf`` where there is no
    /proc. O(1)."""
    try:
        fields = {
            line.split(":")[0]: int(line.split()[1]) * 1024
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.split()[-1] == "kB"
        }
        total, available = fields["MemTotal"], fields["MemAvailable"]
    except (OSError, KeyError):
        page = os.sysconf("SC_PAGE_SIZE")
        total = page * os.sysconf("SC_PHYS_PAGES")
        available = page * os.sysconf("SC_AVPHYS_PAGES")
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
         "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = int(Path(limit_file).read_text())
            usage = int(Path(usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit < total:
            total, available = limit, min(available, max(0, limit - usage))
        break
    return total, available


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping_pong(rank: int, buf: torch.Tensor, warmup: int, repeats: int) -> float:
    """Median round-trip seconds of ``buf`` from rank 0 to rank 1 and back."""
    samples = []
    for r in range(warmup + repeats):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        if r >= warmup:
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _link_worker(
    rank: int,
    port: int,
    message_bytes: int,
    repeats: int,
    timeout_s: float,
    cpu: int | None,
    results: Any,
) -> None:
    """One rank of :func:`probe_link`, pinned to ``cpu`` when given; rank 0 puts
    ``("ok", rtt_small, rtt_big)`` or either rank ``("error", text)`` on ``results``."""
    torch.set_num_threads(1)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=2,
            timeout=timedelta(seconds=timeout_s),
        )
        small = _ping_pong(rank, torch.zeros(1), 5, 4 * repeats)
        big = _ping_pong(rank, torch.zeros(max(1, message_bytes // 4)), 2, repeats)
        if rank == 0:
            results.put(("ok", small, big))
        dist.destroy_process_group()
    except Exception as exc:  # reported to the parent, which raises ProbeError
        results.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))


def probe_link(
    *, message_bytes: int = 16 * 2**20, repeats: int = 5, timeout_s: float = 60.0
) -> LinkProbe:
    """Bandwidth and latency between two local gloo ranks (method in the module
    docstring). ``timeout_s`` bounds the whole probe (process start included) and each
    gloo operation. Raises :class:`ProbeError` when a rank fails or the time runs out."""
    # spawned, not forked from the executor's preloaded forkserver (executor/core/starting.py):
    # one probe per `edgepipe profile` saves little, and its time-out test
    # (tests/integration/test_profiler.py) counts on a start slower than 0.3 s
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    procs = [
        ctx.Process(
            target=_link_worker,
            args=(
                rank, port, message_bytes, repeats, timeout_s,
                cpus[rank] if len(cpus) >= 2 else None, results,
            ),
            daemon=True,
        )
        for rank in (0, 1)
    ]
    deadline = time.monotonic() + timeout_s
    status = "error"
    for p in procs:
        p.start()
    try:
        while True:
            try:
                status, *values = results.get(timeout=0.2)
                break
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise ProbeError(f"link probe: no result within {timeout_s:g} s") from None
                if all(p.exitcode is not None for p in procs) and results.empty():
                    codes = [p.exitcode for p in procs]
                    raise ProbeError(
                        f"link probe: ranks exited ({codes}) without a result"
                    ) from None
    finally:
        # after a result the ranks are closing down; after a failure a survivor may be
        # blocked in gloo until its timeout, so it is killed at once
        for p in procs:
            p.join(timeout=5 if status == "ok" else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
    if status != "ok":
        raise ProbeError(f"link probe failed: {values[0]}")
    small_rtt, big_rtt = values
    latency_s = small_rtt / 2
    transfer_s = big_rtt / 2 - latency_s
    if transfer_s <= 0:
        transfer_s = big_rtt / 2
    return LinkProbe(
        bandwidth_mbps=message_bytes * 8 / transfer_s / 1e6,
        latency_ms=latency_s * 1e3,
        message_bytes=message_bytes,
    )


def _conv_workload() -> tuple[nn.Module, torch.Tensor]:
    """A ResNet-like 3x3 convolution, 64 -> 64 channels, batch 8 at 56x56."""
    gen = torch.Generator().manual_seed(0)
    conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)
    return conv, torch.randn(8, 64, 56, 56, generator=gen)


def probe_device(
    *,
    model: nn.Module | None = None,
    example_input_fn: Callable[[int], torch.Tensor] | None = None,
    batch_size: int = 8,
    num_threads: int | None = None,
    repeats: int = 5,
    message_bytes: int = 16 * 2**20,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Measure this machine; return a dict that validates as a device catalog
    ``$defs/device_type`` entry (every figure's source says when and where it was
    measured). ``model`` and ``example_input_fn`` (both or neither) give the training
    step the efficiency is measured on, at ``batch_size``; without them a 3x3
    convolution is used. ``num_threads`` sets torch threads for the compute probes
    (restored after). Cost: a few seconds of compute plus two spawned processes.
    """
    if (model is None) != (example_input_fn is None):
        raise ValueError("give both model and example_input_fn, or neither")
    saved_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        threads = torch.get_num_threads()
        peak = matmul_gflops(repeats=repeats)
        if model is not None and example_input_fn is not None:
            workload, x = model, example_input_fn(batch_size)
            what = f"a training step of the given model at batch {batch_size}"
        else:
            workload, x = _conv_workload()
            what = "a training step of a 3x3 convolution, 64 channels, 8x56x56"
        achieved = train_step_gflops(workload, x, repeats=repeats)
    finally:
        torch.set_num_threads(saved_threads)
    total, available = memory_bytes()
    link = probe_link(message_bytes=message_bytes, repeats=repeats, timeout_s=timeout_s)
    host = platform.node()
    stamp = f"measured by edgepipe probe on {host} {now_iso()}"
    return {
        "description": f"{host}: {cpu_model()}, {os.cpu_count()} cores, probed with "
        f"{threads} torch threads",
        "memory_bytes": float(total),
        "usable_fraction": round(min(1.0, max(available, 1) / total), 4),
        "peak_fp32_gflops": round(peak, 2),
        "efficiency": round(min(1.0, achieved / peak), 4),
        "network": {
            "interface": "loopback (2 local gloo ranks)",
            "bandwidth_mbps": round(link.bandwidth_mbps, 1),
        },
        "sources": {
            "memory": f"{stamp}: MemTotal of /proc/meminfo (or the cgroup limit)",
            "usable_fraction": f"{stamp}: MemAvailable / MemTotal at probe time",
            "peak_fp32_gflops": f"{stamp}: median of {repeats} fp32 2048x2048 matmuls, "
            f"{threads} threads",
            "efficiency": f"{stamp}: {achieved:.1f} GFLOP/s on {what} "
            "(FLOPs by FlopCounterMode) / peak",
            "network": f"{stamp}: gloo ping-pong between 2 local ranks, "
            f"{link.message_bytes} B messages; latency {link.latency_ms:.3f} ms",
        },
    }
