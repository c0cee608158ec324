"""Import PipeDream ``graph.txt`` profiles as :class:`~planner.inputs.profile.ModelProfile` chains.

Format (msr-fiddle/pipedream, ``graph/graph.py``; one item per line)::

    nodeID -- <layer repr> -- forward_compute_time=<ms>, backward_compute_time=<ms>,
        activation_size=<bytes>, parameter_size=<bytes>[ -- stage_id=<k>]
    \\tnodeA -- nodeB

(a node is one line; it is wrapped here for width).

Leading/trailing whitespace (tabs, spaces, space+tab, CR) is ignored, so every indentation
variant of an edge line parses the same. The layer repr may itself contain `` -- ``: the
metrics part is the *last* field that starts with ``forward_compute_time=`` and only
``key=value`` fields (PipeDream's optional ``stage_id``) may follow it. ``activation_size``
may be a list ``[a; b; c]`` (a layer with several outputs); its sum is used, as PipeDream's
own parser does. Sizes are bytes and times milliseconds for one profiled minibatch of
``batch_size`` samples.

DAG to chain
------------
A chain planner cuts between blocks; a branchy graph must stay cuttable. The layer graph
(Input nodes removed, see below) is ordered topologically (Kahn's algorithm, ties by file
order), and a stage boundary may fall after any position of that order: PipeDream's
antichain idea, priced as a chain. The boundary after position i carries every tensor
that crosses it: the outputs of the nodes at or before i that some node after i consumes,
summed (each output once, however many later nodes read it). A node whose output nothing
consumes (a sink, e.g. an unused tuple output) sends nothing across any boundary, so it
fuses nothing that follows it. Cutting only where one node separates the graph (the
dominator cuts of earlier versions) collapses a network whose skip connections span it
(encoder-decoder with attention, Inception- or NASNet-style nets) into a handful of
blocks or one, and then it cannot be pipelined at all.

Blocks are the single nodes of the order, except that a coarse block is kept where it
loses nothing. A node is *free* when it does no work and holds nothing: zero forward and
backward time, no parameters, and some later node reads its output (Size, View, Add,
Concat, Dropout as PipeDream records them; a node whose output nothing reads, e.g. an
unused tuple output, is never free, so it never fuses what follows it). **Rule:** of the
boundaries next to a maximal run of consecutive free positions s..e of the order (the
one after s-1, those inside the run and the one after e, as far as they exist) only the
one with the fewest crossing bytes is kept (ties: the earliest); every other boundary is
kept. A run of k free nodes so removes k boundaries.

*Why it loses no plan.* All boundaries of one run separate the same working nodes, so
moving a stage cut from one to another moves only free nodes between two stages: every
stage keeps its forward and backward times (at every batch size and device type), its
parameters (hence its static memory, all-reduce and replicas) and, because a free node's
saved bytes are charged to its keeper (below), a working node after the run, its saved
activation bytes; only the bytes crossing that cut change, and the kept boundary carries
the fewest. So every plan whose stages each hold a working node has a twin on the kept
boundaries that is no worse, as long as the objective does not decrease when a link
carries more bytes (true of the cost model: a transfer is bytes / bandwidth + latency on
its channel). Not covered: a node-by-node plan with a stage of free nodes only (two
cuts in one run), which does no work and at best relays a tensor between two devices;
the fused graph cannot express it. ``tests/unit/test_pipedream_import.py`` checks the
claim by brute force over every plan of random branchy graphs (and with the DP), fused
against node by node, with memory tight enough that saved bytes decide feasibility.
Cost: one block per working node plus at most one per run (resnet18 60 blocks from 70
layers); the DP's work grows with the square of the block count (docs/benchmarks.md).

Block figures (per sample = per minibatch figure / ``batch_size``):

- ``param_bytes``: sum of the members' ``parameter_size``.
- ``output_bytes_per_sample``: the bytes crossing the block's closing boundary (for the
  final block: the sum over its sink nodes, the model's outputs).
- ``saved_bytes_per_sample``: sum of the ``activation_size`` charged to the members. A
  working node is charged its own output. A free node has no backward of its own; its
  output is held by the layer that reads it, so it is charged to its *keeper*: its
  earliest reader in the order, or that reader's keeper when the reader is free too (a
  working node after the free node's run). Approximation: every output is assumed kept
  for backward once; in-place layers (``ReLU(inplace)``)
  and layers whose backward needs no stored output make this an over-estimate, and
  cuDNN workspaces are not counted.
- forward / backward ms: sum over the members (they run one after another on one device),
  recorded as a single measured point at ``batch_size`` (``Timing.source = "imported"``);
  no batch scaling is assumed.

Input nodes (layer repr starting with ``Input``, e.g. ``Input``, ``Input0``) are not
blocks: their ``activation_size / batch_size`` summed is ``input_bytes_per_sample``. They
are removed *before* the boundary analysis, because the data loader can hand an input to
whichever stage consumes it (a second input that feeds a late layer, as in PipeDream's
GNMT profile, would otherwise cross every boundary). Their profiled "forward time" is
data loading, not compute, and is dropped. An Input's ``activation_size`` is its whole
profiled minibatch, so it must be a whole multiple of ``batch_size``: a batch size that
does not divide it contradicts the profile and is refused. So is one that does not
divide a Linear layer's output into whole samples of ``out_features`` fp32 values.

A graph.txt does not record the batch it was profiled at, so ``batch_size`` must be
given and must be that batch: a smaller one that divides every size (128 for a graph
profiled at 256) multiplies every per-sample figure and cannot be refused.
:func:`implied_batch` reads the likely batch off the Linear layers (exact for a
classifier) and the CLI warns when ``--batch-size`` is below it.

:func:`swallowing_block` names a block holding most of the graph's time (a sign that the
profile cannot be pipelined well); the CLI prints it as a warning.

Complexity: parsing O(L) for L lines; Kahn's topological sort, the boundary sweep, the
runs of free nodes and the keepers O(V + E); the whole import is linear in the file size.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.profile import Block, ModelProfile, Timing

TOOL = "edgepipe import-pipedream"

#: the four metrics every node line carries
_METRICS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")

_SEP = re.compile(r"\s+--\s+")
_KEY_VALUE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")

#: a Linear layer's description, as PyTorch prints it, and its output width
_LINEAR = re.compile(r"^Linear\(.*\bout_features=(\d+)")
#: bytes of one value of a profiled activation (PipeDream profiles in fp32)
FP32_BYTES = 4

_NODE_FORMAT = (
    "write a node line as 'nodeID -- <layer> -- forward_compute_time=<ms>, "
    "backward_compute_time=<ms>, activation_size=<bytes>, parameter_size=<bytes>' "
    "or an edge line as 'nodeA -- nodeB'"
)


@dataclass(frozen=True)
class _Node:
    """One parsed node line."""

    node_id: str
    desc: str
    forward_ms: float
    backward_ms: float
    activation_bytes: float
    param_bytes: float
    line: int

    @property
    def is_input(self) -> bool:
        return self.desc.startswith("Input")

    @property
    def layer_type(self) -> str:
        head = self.desc.split("(", 1)[0].strip()
        return head or "layer"


def import_pipedream(
    path: str | Path,
    *,
    batch_size: int = 128,
    device_type: str = "v100",
    name: str | None = None,
) -> ModelProfile:
    """Read a PipeDream ``graph.txt`` file and return it as a chain-of-blocks profile.

    Args:
        path: the ``graph.txt`` file.
        batch_size: samples in the profiled minibatch (PipeDream's ``-b``). Sizes and times
            in the file are for this many samples. Check it against the Input node:
            ``input activation_size / batch_size`` must be one sample's input bytes.
        device_type: device type name the measured times are filed under.
        name: profile name; default derived from the path (``vgg16/graph.txt`` ->
            ``vgg16``, ``vgg16.graph.txt`` -> ``vgg16``).

    Raises:
        InputError: unreadable file or malformed content (see :func:`parse_pipedream`).

    Complexity: linear in the file size.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(str(p), "", "file not found; check the path") from None
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text ({exc.reason}); give a graph.txt file"
        raise InputError(str(p), "", problem) from None
    except OSError as exc:
        raise InputError(str(p), "", f"cannot read the file ({exc.strerror})") from None
    return parse_pipedream(
        text,
        str(p),
        batch_size=batch_size,
        device_type=device_type,
        name=name if name is not None else _default_name(p),
        file_label=p.name,
    )


def parse_pipedream(
    text: str,
    source: str,
    *,
    batch_size: int = 128,
    device_type: str = "v100",
    name: str | None = None,
    file_label: str | None = None,
) -> ModelProfile:
    """Parse PipeDream ``graph.txt`` content and build the chain-of-blocks profile.

    ``source`` names the origin in error messages; ``file_label`` (default ``source``)
    is the file name recorded in the profile's ``source.detail``. See the module
    docstring for the format, the cut rule and the block figures.

    Raises:
        InputError: ``(source, "line N", problem)`` for an unparsable line, a negative or
            non-finite number, a missing metric, a duplicate node id, an edge naming an
            undefined node, an edge into an Input node, a cycle, an empty file or a file
            without layer nodes; ``(source, "", problem)`` for a bad argument.

    Complexity: O(L + V + E).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(source, "", f"batch size {batch_size!r} must be a positive integer")
    if not device_type:
        raise InputError(source, "", "device type must be a non-empty name, e.g. 'v100'")
    nodes, edges = _parse_lines(text, source)
    blocks, input_bytes = _chain(nodes, edges, batch_size, source)
    fwd = tuple((t,) for t in (b[1] for b in blocks))
    bwd = tuple((t,) for t in (b[2] for b in blocks))
    label = file_label if file_label is not None else source
    return ModelProfile(
        name=name if name else _default_name(Path(label)),
        source={
            "kind": "imported",
            "detail": f"PipeDream graph.txt {label}, batch {batch_size}, device type {device_type}",
            "tool": TOOL,
        },
        input_bytes_per_sample=input_bytes,
        blocks=tuple(b[0] for b in blocks),
        timings={
            device_type: Timing(
                batch_sizes=(batch_size,), forward_ms=fwd, backward_ms=bwd, source="imported"
            )
        },
    )


# -- parsing ------------------------------------------------------------------------------


def _default_name(p: Path) -> str:
    stem = p.name[: -len(".txt")] if p.name.endswith(".txt") else p.name
    if stem == "graph" and p.parent.name:
        return p.parent.name
    if stem.endswith(".graph"):
        stem = stem[: -len(".graph")]
    return stem or "pipedream-model"


def _number(text: str, key: str, source: str, where: str) -> float:
    """Parse one metric value: a float, or a ``[a; b; ...]`` list that is summed."""
    raw = text.strip()
    if raw.startswith("[") and raw.endswith("]"):
        parts = [x for x in (s.strip() for s in raw[1:-1].split(";")) if x]
        return math.fsum(_number(x, key, source, where) for x in parts)
    try:
        value = float(raw)
    except ValueError:
        raise InputError(
            source, where, f"{key}={raw!r} is not a number; write a decimal number such as 1.5"
        ) from None
    if not math.isfinite(value):
        raise InputError(source, where, f"{key}={raw} is not finite; write a finite number")
    if value < 0:
        raise InputError(source, where, f"{key}={raw} is negative; times and sizes must be >= 0")
    return value


def _parse_node(fields: list[str], k: int, source: str, lineno: int) -> _Node:
    """Build a node from ``fields`` (split on `` -- ``) whose metrics field is ``fields[k]``."""
    where = f"line {lineno}"
    node_id = fields[0]
    desc = " -- ".join(fields[1:k]).strip()
    if not node_id or any(c.isspace() for c in node_id):
        raise InputError(source, where, f"node id {node_id!r} must be one word; {_NODE_FORMAT}")
    if not desc:
        raise InputError(source, where, f"node {node_id} has no layer description; {_NODE_FORMAT}")
    for extra in fields[k + 1 :]:
        if not _KEY_VALUE.match(extra.strip()):
            raise InputError(
                source,
                where,
                f"unexpected text {extra!r} after the metrics; only "
                "'key=value' fields such as 'stage_id=0' may follow them",
            )
    values: dict[str, float] = {}
    for item in fields[k].split(","):
        item = item.strip()
        if not item:
            continue
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq:
            raise InputError(source, where, f"metric {item!r} is not 'key=value'; {_NODE_FORMAT}")
        if key in values:
            raise InputError(source, where, f"metric {key} is given twice; give it once")
        if key in _METRICS:
            values[key] = _number(raw, key, source, where)
    missing = [m for m in _METRICS if m not in values]
    if missing:
        raise InputError(
            source, where, f"node {node_id} lacks {', '.join(missing)}; {_NODE_FORMAT}"
        )
    return _Node(
        node_id=node_id,
        desc=desc,
        forward_ms=values["forward_compute_time"],
        backward_ms=values["backward_compute_time"],
        activation_bytes=values["activation_size"],
        param_bytes=values["parameter_size"],
        line=lineno,
    )


def _parse_lines(text: str, source: str) -> tuple[dict[str, _Node], list[tuple[str, str, int]]]:
    """Split ``text`` into nodes (in file order) and edges ``(a, b, line)``. O(L)."""
    nodes: dict[str, _Node] = {}
    edges: list[tuple[str, str, int]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        fields = _SEP.split(line)
        k = max(
            (i for i, f in enumerate(fields) if f.startswith("forward_compute_time")),
            default=-1,
        )
        if k >= 2:
            node = _parse_node(fields, k, source, lineno)
            if node.node_id in nodes:
                raise InputError(
                    source,
                    f"line {lineno}",
                    f"node {node.node_id} is defined again (first "
                    f"on line {nodes[node.node_id].line}); give every node one line",
                )
            nodes[node.node_id] = node
        elif len(fields) == 2 and all(
            f and "=" not in f and not any(c.isspace() for c in f) for f in fields
        ):
            edges.append((fields[0], fields[1], lineno))
        else:
            shown = line if len(line) <= 80 else line[:77] + "..."
            raise InputError(source, f"line {lineno}", f"cannot parse {shown!r}; {_NODE_FORMAT}")
    if not nodes and not edges:
        raise InputError(source, "line 1", "the file is empty; give a PipeDream graph.txt")
    for a, b, lineno in edges:
        for end in (a, b):
            if end not in nodes:
                raise InputError(
                    source,
                    f"line {lineno}",
                    f"edge {a} -- {b} names node {end}, which no "
                    "node line defines; add its node line or fix the id",
                )
    if not nodes:
        raise InputError(source, "line 1", "the file has edges but no node lines")
    return nodes, edges


# -- DAG to chain ---------------------------------------------------------------------------


def _find_cycle(left: set[str], preds: dict[str, list[tuple[str, int]]]) -> tuple[list[str], int]:
    """A cycle among ``left`` (nodes Kahn's sort could not place) and one of its edge lines.

    Every such node has a predecessor in ``left``; walking predecessors must revisit a
    node. O(V + E).
    """
    start = min(left)
    seen: dict[str, int] = {}
    walk: list[tuple[str, int]] = []  # (node, line of the edge we arrived by)
    cur, line = start, 0
    while cur not in seen:
        seen[cur] = len(walk)
        walk.append((cur, line))
        cur, line = next((p, ln) for p, ln in preds[cur] if p in left)
    cycle = walk[seen[cur] :]
    cycle_line = line if len(cycle) == 1 else cycle[1][1]
    names = [n for n, _ in reversed(cycle)]
    return [*names, names[0]], cycle_line or line


def _chain(
    nodes: dict[str, _Node],
    edges: list[tuple[str, str, int]],
    batch: int,
    source: str,
) -> tuple[list[tuple[Block, float, float]], float]:
    """Blocks (with forward and backward ms) and input bytes per sample. O(V + E)."""
    inputs = [n for n in nodes.values() if n.is_input]
    layers = [n for n in nodes.values() if not n.is_input]
    input_bytes = math.fsum(n.activation_bytes for n in inputs) / batch
    if not layers:
        first = min(n.line for n in nodes.values())
        raise InputError(
            source, f"line {first}", "the graph has only Input nodes; it needs layer nodes"
        )

    succ: dict[str, list[str]] = {n.node_id: [] for n in layers}
    preds: dict[str, list[tuple[str, int]]] = {n.node_id: [] for n in layers}
    indeg: dict[str, int] = dict.fromkeys(succ, 0)
    seen_edges: set[tuple[str, str]] = set()
    for a, b, lineno in edges:
        if nodes[b].is_input:
            raise InputError(
                source,
                f"line {lineno}",
                f"edge {a} -- {b} leads into Input node {b}; an "
                "Input has no predecessors: fix the edge or the node's description",
            )
        if nodes[a].is_input or (a, b) in seen_edges:
            continue  # input edges do not constrain cuts; duplicate edges add nothing
        seen_edges.add((a, b))
        succ[a].append(b)
        preds[b].append((a, lineno))
        indeg[b] += 1

    # Kahn's algorithm; ties broken by file order, so the result is deterministic.
    queue = deque(n.node_id for n in layers if indeg[n.node_id] == 0)
    order: list[str] = []
    while queue:
        v = queue.popleft()
        order.append(v)
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                queue.append(w)
    if len(order) < len(layers):
        placed = set(order)
        cycle, lineno = _find_cycle({v for v in succ if v not in placed}, preds)
        raise InputError(
            source,
            f"line {lineno}",
            f"the graph has a cycle {' -> '.join(cycle)}; a "
            "profile must be acyclic: remove the edge that points backwards",
        )

    for node in inputs:  # the structure is sound; now the batch size against the inputs
        if node.activation_bytes % batch:
            raise InputError(
                source,
                f"line {node.line}",
                f"Input node {node.node_id} holds {node.activation_bytes:.0f} bytes for the "
                f"profiled minibatch, which batch size {batch} does not divide; give the "
                "--batch-size the graph was profiled at",
            )
    for node in layers:  # and against the Linear layers' outputs
        width = _linear_width(node)
        if width is not None and node.activation_bytes % (batch * width * FP32_BYTES):
            raise InputError(
                source,
                f"line {node.line}",
                f"Linear node {node.node_id} outputs {node.activation_bytes:.0f} bytes for the "
                f"profiled minibatch, not a whole number of {batch} samples x {width} fp32 "
                "values; give the --batch-size the graph was profiled at (a classifier's: "
                "its last Linear's activation_size / 4 / out_features)",
            )

    # Boundaries: one after every position of the topological order but the last; the
    # tensors crossing the boundary after position i are the outputs of nodes at or
    # before i consumed after i (sinks' outputs feed nothing and cross nothing).
    n = len(order)
    pos = {v: i for i, v in enumerate(order)}
    delta = [0.0] * (n + 1)
    for v in order:
        if succ[v]:
            delta[pos[v]] += nodes[v].activation_bytes
            delta[max(pos[w] for w in succ[v])] -= nodes[v].activation_bytes
    crossing, running = [], 0.0
    for i in range(n - 1):
        running += delta[i]
        crossing.append(running)
    keep = _kept_boundaries(order, nodes, succ, crossing)
    saved = _saved_bytes(order, nodes, succ, pos)
    blocks: list[tuple[Block, float, float]] = []
    members: list[_Node] = []
    for i, v in enumerate(order):
        members.append(nodes[v])
        if i < n - 1 and keep[i]:
            blocks.append(_block(members, crossing[i], saved, batch))
            members = []
    out = math.fsum(m.activation_bytes for m in members if not succ[m.node_id])
    blocks.append(_block(members, out, saved, batch))
    return blocks, input_bytes


def _is_free(node: _Node, succ: dict[str, list[str]]) -> bool:
    """A node that does no work and holds nothing: no forward or backward time, no
    parameters, and some later node consumes its output (a sink is never free: its
    saved bytes stay where it is, so it pins the boundaries around it)."""
    idle = not (node.forward_ms or node.backward_ms or node.param_bytes)
    return idle and bool(succ[node.node_id])


def _kept_boundaries(
    order: list[str],
    nodes: dict[str, _Node],
    succ: dict[str, list[str]],
    crossing: list[float],
) -> list[bool]:
    """``keep[i]``: whether the boundary after position ``i`` is offered to the planners.

    Rule: the boundaries next to a maximal run of consecutive free positions s..e (the
    one before it, those inside it and the one after it; at the ends of the order only
    those that exist) all separate the same working nodes, so of them only the one
    carrying the fewest bytes is kept (ties: the earliest). Every other boundary is kept.
    Why this loses no plan: module docstring. O(V)."""
    n = len(order)
    keep = [True] * (n - 1)
    i = 0
    while i < n:
        if not _is_free(nodes[order[i]], succ):
            i += 1
            continue
        start = i
        while i < n and _is_free(nodes[order[i]], succ):
            i += 1
        candidates = range(max(start - 1, 0), min(i - 1, n - 2) + 1)
        best = min(candidates, key=lambda k: (crossing[k], k))
        for k in candidates:
            keep[k] = k == best
    return keep


def _saved_bytes(
    order: list[str],
    nodes: dict[str, _Node],
    succ: dict[str, list[str]],
    pos: dict[str, int],
) -> dict[str, float]:
    """Saved-activation bytes (whole minibatch) each node's block is charged for.

    A working node keeps its own output. A free node keeps nothing for its own backward
    (it has none); its output is held by the layer that reads it, so its bytes are
    charged to its keeper: its earliest consumer in the order, or, when that is free
    too, that node's keeper. A keeper is always a working node after the free node's
    run, so the charge does not depend on which boundary of the run a plan cuts at.
    Reverse topological order computes every keeper once. O(V + E)."""
    keeper: dict[str, str] = {}
    for v in reversed(order):
        if _is_free(nodes[v], succ):
            keeper[v] = keeper[min(succ[v], key=pos.__getitem__)]
        else:
            keeper[v] = v
    saved = dict.fromkeys(order, 0.0)
    for v in order:
        saved[keeper[v]] += nodes[v].activation_bytes
    return saved


#: a block holding more than this share of the forward + backward time is reported
SWALLOW_SHARE = 0.5


def _linear_width(node: _Node) -> int | None:
    """``out_features`` of a ``Linear(...)`` node (its output's last dimension), else None."""
    match = _LINEAR.match(node.desc)
    return int(match.group(1)) if match and int(match.group(1)) > 0 else None


def implied_batch(text: str, source: str) -> int | None:
    """The fewest samples a Linear layer's output of the graph holds, ``activation_size /
    (4 x out_features)`` (fp32) over the Linear nodes; None without one. A graph.txt does
    not record its profiled batch: for a classifier, whose Linear layers output one
    vector per sample, this is it; a sequence model's hold one per token, a multiple of
    it. The CLI warns when ``--batch-size`` is below it. O(L)."""
    nodes, _ = _parse_lines(text, source)
    counts = [n.activation_bytes / (w * FP32_BYTES) for n in nodes.values()
              if (w := _linear_width(n)) is not None]
    whole = [int(c) for c in counts if c >= 1 and c.is_integer()]
    return min(whole) if whole else None


def swallowing_block(profile: ModelProfile) -> str | None:
    """A warning when one block of a profile with several layers holds more than
    ``SWALLOW_SHARE`` of its forward + backward time (the planners cannot spread that
    block over stages), else ``None``."""
    timing = next(iter(profile.timings.values()))
    times = [f[0] + b[0] for f, b in zip(timing.forward_ms, timing.backward_ms, strict=True)]
    total = math.fsum(times)
    if profile.num_blocks < 2 or total <= 0:
        return None
    i = max(range(len(times)), key=times.__getitem__)
    if times[i] <= SWALLOW_SHARE * total:
        return None
    block = profile.blocks[i]
    return (
        f"block {i} ({block.name}, {len(block.members)} layers) holds "
        f"{times[i] / total:.0%} of the model's time; a pipeline cannot split it"
    )


def _block(
    members: list[_Node], output_bytes: float, saved: dict[str, float], batch: int
) -> tuple[Block, float, float]:
    last = members[-1]
    block = Block(
        name=f"{last.layer_type}-{last.node_id}",
        param_bytes=math.fsum(m.param_bytes for m in members),
        output_bytes_per_sample=output_bytes / batch,
        saved_bytes_per_sample=math.fsum(saved[m.node_id] for m in members) / batch,
        members=tuple(m.node_id for m in members),
    )
    return (
        block,
        math.fsum(m.forward_ms for m in members),
        math.fsum(m.backward_ms for m in members),
    )
