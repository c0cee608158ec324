"""Split an ordinary ``nn.Module`` into a chain of blocks at module boundaries.

edgepipe's profiler and runtime take a model as a chain of blocks (an ``nn.Sequential``
whose children each take one tensor and return one). An ordinary model (embeddings, a
``ModuleList`` of layers with residuals inside, a head) is not written that way; this
module turns it into one, as torch pipelining's frontend does (``torch.distributed.
pipelining._IR``: trace, then cut the graph), but without markers in the model's code:

1. **Trace** the model with ``torch.fx.symbolic_trace``: one graph of its forward in
   execution order; every node records the modules it runs inside
   (``node.meta["nn_module_stack"]``). Parameters appear as ``call_module`` targets
   (leaf modules) or ``get_attr`` nodes.
2. **Candidate cuts.** A cut "at module ``M``" is the position of the first node that
   runs inside ``M``. The values that cross it are the nodes before it (parameters
   aside) with a user at or after it; a cut is valid when exactly one value crosses
   (it is then the only input the next block needs). ``auto`` tries the start of
   every top-level child of the model, with ``ModuleList``/``ModuleDict``/
   ``Sequential`` children expanded into their items (recursively), and keeps the
   valid ones; explicit FQNs must each be valid, or the split is refused with one line
   naming the FQN and the values that cross.
3. **Blocks.** Nodes between two cuts become one ``fx.GraphModule`` with one
   placeholder (the crossing value) and one output (the value crossing the next cut,
   or the model's output). Each block references the model's own submodules and
   parameters under their original names, so block ``layers_2``'s state dict holds
   ``layers.2.attn.qkv.weight`` etc., and the chain computes exactly what the model
   computes (the same operations in the same order). A parameter used by two blocks
   (tied weights, a module called in two places across a cut) is refused: two
   pipeline stages cannot share a weight. A buffer read as a tensor in several blocks
   (rotary frequencies, as torchtitan's Llama passes to every layer) is copied into
   each: it must not change during training.

Cost: tracing is one symbolic forward; with ``N`` graph nodes and ``K`` candidate
cuts, finding the crossing values is O(N + K x N) (a last-use index per node, then one
scan per cut); building the blocks is O(N).

Rebuilding in a worker: :func:`chain` is itself a ``package.module:callable`` (named by
:data:`BUILDER`), so a profile's build spec ``{"callable": BUILDER, "kwargs":
{"factory": ..., "split": [...], "seed": s, "modules": [[...], ...]}}`` makes every
process build the same chain (``modules``, the candidate modules each block runs, is
checked on rebuilding, and names a plan's stages by module for ``edgepipe export``).
The factory is called with torch's global RNG seeded with ``s`` (inside
``torch.random.fork_rng``, so the caller's RNG is untouched), hence identical weights
in every process and every plan of the model, whatever its split.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.fx as fx
from edgepipe.executor.profiling import zoo
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.profile import BuildSpec
from torch import nn

#: the ``package.module:callable`` that rebuilds a split chain (:func:`chain`)
BUILDER = f"{__name__}:chain"
#: ``--split`` value that cuts at every valid candidate
AUTO = "auto"
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


@dataclass(frozen=True)
class Cut:
    """A valid cut: the module ``fqn`` whose first node is graph node ``position``;
    ``value`` is the one node that crosses it."""

    fqn: str
    position: int
    value: fx.Node


def candidates(model: nn.Module) -> list[str]:
    """The FQNs ``auto`` tries, in module order: the model's children, a container child
    (``ModuleList``, ``ModuleDict``, ``Sequential``) replaced by its items, recursively.
    A model that is itself a container is expanded the same way. O(modules)."""

    def expand(prefix: str, module: nn.Module) -> list[str]:
        out: list[str] = []
        for name, child in module.named_children():
            fqn = f"{prefix}{name}"
            out += expand(f"{fqn}.", child) if isinstance(child, _CONTAINERS) else [fqn]
        return out

    return expand("", model)


def trace(model: nn.Module, source: str) -> fx.GraphModule:
    """``torch.fx.symbolic_trace(model)``, checked to take one input and return one
    value; a model fx cannot trace (data-dependent control flow) is an InputError."""
    try:
        traced = fx.symbolic_trace(model)
    except Exception as exc:  # fx raises TraceError, TypeError, RuntimeError, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(
            source, "", f"torch.fx cannot trace it ({first}); edgepipe splits models whose "
            "forward has no data-dependent control flow"
        ) from None
    nodes = list(traced.graph.nodes)
    inputs = [n.name for n in nodes if n.op == "placeholder"]
    if len(inputs) != 1:
        raise InputError(
            source, "", f"its forward takes {len(inputs)} inputs ({', '.join(inputs)}); a "
            "chain of blocks takes one tensor"
        )
    if not isinstance(nodes[-1].args[0], fx.Node):
        raise InputError(
            source, "", "its forward returns a container, not one tensor; return the "
            "tensor the loss reads"
        )
    return traced


def _modules_of(node: fx.Node) -> list[str]:
    stack = node.meta.get("nn_module_stack", {})
    return [fqn for fqn, _ in stack.values()]


class _Graph:
    """The traced graph's node order, last uses and module starts."""

    def __init__(self, traced: fx.GraphModule) -> None:
        self.traced = traced
        self.nodes = list(traced.graph.nodes)
        self.index = {n: i for i, n in enumerate(self.nodes)}
        self.last_use = {
            n: max((self.index[u] for u in n.users), default=self.index[n]) for n in self.nodes
        }
        self.start: dict[str, int] = {}
        self.end: dict[str, int] = {}
        for i, n in enumerate(self.nodes):
            for fqn in _modules_of(n):
                self.start.setdefault(fqn, i)
                self.end[fqn] = i
        self.first_compute = next(
            i for i, n in enumerate(self.nodes) if n.op not in ("placeholder", "get_attr")
        )

    def describe(self, node: fx.Node) -> str:
        """``add_2 (output of layers.0)``: the node and the outermost module it ends."""
        if node.op == "placeholder":
            return f"{node.name} (the model's input)"
        inside = _modules_of(node)
        ends = [m for m in inside if self.end[m] == self.index[node]]
        if ends:
            return f"{node.name} (output of {ends[0]})"
        return f"{node.name} (in {inside[-1]})" if inside else f"{node.name} (in forward)"

    def crossing(self, position: int) -> list[fx.Node]:
        """Values (parameters aside) defined before ``position`` and used at or after."""
        return [
            n for n in self.nodes[:position]
            if n.op != "get_attr" and self.last_use[n] >= position
        ]

    def cut(self, fqn: str, source: str) -> Cut:
        """The cut at module ``fqn``, or an InputError naming why it is not one."""
        if fqn not in self.start:
            known = dict(self.traced.named_modules())
            why = "is not called by forward" if fqn in known else "is no module of the model"
            raise InputError(source, "", f"cannot cut at {fqn!r}: it {why}")
        position = self.start[fqn]
        if position <= self.first_compute:
            raise InputError(
                source, "", f"cannot cut at {fqn!r}: it is where the model starts"
            )
        values = self.crossing(position)
        if len(values) != 1:
            raise InputError(
                source, "", f"cannot cut at {fqn!r}: {len(values)} values cross there, not "
                f"1: {', '.join(map(self.describe, values))}; cut where one tensor crosses "
                "(--split auto lists them)"
            )
        return Cut(fqn, position, values[0])


def find_cuts(graph: _Graph, model: nn.Module, split: str | Sequence[str],
              source: str) -> list[Cut]:
    """The cuts of ``split``: ``"auto"`` (every valid :func:`candidates` position, the
    first FQN of each position) or FQNs in execution order. O(K x N) (module docstring)."""
    if split == AUTO:
        cuts: dict[int, Cut] = {}
        for fqn in candidates(model):
            if fqn in graph.start and graph.start[fqn] > graph.first_compute:
                values = graph.crossing(graph.start[fqn])
                if len(values) == 1 and graph.start[fqn] not in cuts:
                    cuts[graph.start[fqn]] = Cut(fqn, graph.start[fqn], values[0])
        return [cuts[p] for p in sorted(cuts)]
    out = [graph.cut(fqn, source) for fqn in split]
    for a, b in pairwise(out):
        if b.position <= a.position:
            raise InputError(
                source, "", f"cut {b.fqn!r} does not come after {a.fqn!r} in execution "
                "order; list the cuts in the order forward runs them"
            )
    return out


def _weights(traced: fx.GraphModule, node: fx.Node) -> dict[int, str]:
    """id -> name of the state ``node`` owns: a called module's parameters and buffers,
    a parameter it reads. A buffer read as a tensor (``get_attr``, e.g. rotary
    frequencies) is owned by none: each block that reads it gets it, as a constant."""
    if node.op not in ("call_module", "get_attr"):
        return {}
    assert isinstance(node.target, str)
    obj: object = traced
    for part in node.target.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, nn.Module):
        return {id(obj): node.target} if isinstance(obj, nn.Parameter) else {}
    named = [*obj.named_parameters(), *obj.named_buffers()]
    return {id(t): f"{node.target}.{name}" for name, t in named}


def build_blocks(
    traced: fx.GraphModule, cuts: Sequence[Cut], first_name: str, source: str
) -> nn.Sequential:
    """The chain of ``traced`` cut at ``cuts`` (module docstring, step 3): block 0 named
    ``first_name``, block ``k`` after its cut's FQN, dots as underscores. Each
    ``get_attr`` node is copied into the block that uses it. O(N)."""
    nodes = list(traced.graph.nodes)
    bounds = [0, *(c.position for c in cuts), len(nodes) - 1]  # the output node last
    fqns = [first_name, *(c.fqn for c in cuts)]
    names = [fqn.replace(".", "_") for fqn in fqns]
    if len(set(names)) != len(names):
        raise InputError(source, "", f"cuts {fqns} give two blocks one name; cut elsewhere")
    owner: dict[int, tuple[str, str]] = {}
    blocks: OrderedDict[str, nn.Module] = OrderedDict()
    for k, (a, b) in enumerate(pairwise(bounds)):
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        if k > 0:
            env[cuts[k - 1].value] = graph.placeholder(cuts[k - 1].value.name)
        for node in nodes[a:b]:
            if node.op == "get_attr":
                continue
            reads = [node, *(n for n in node.all_input_nodes if n.op == "get_attr")]
            for read in reads:
                for tid, name in _weights(traced, read).items():
                    other = owner.setdefault(tid, (fqns[k], name))
                    if other[0] != fqns[k]:
                        raise InputError(
                            source, "", f"cannot cut at {fqns[k]!r}: weight {name} is also "
                            f"used by the block at {other[0]!r} (as {other[1]}); pipeline "
                            "stages cannot share weights (untie them or cut elsewhere)"
                        )
                if read is not node and read not in env:
                    env[read] = graph.node_copy(read)
            env[node] = graph.node_copy(node, env.__getitem__)
        result = cuts[k].value if k < len(cuts) else nodes[-1].args[0]
        assert isinstance(result, fx.Node)
        graph.output(env[result])
        blocks[names[k]] = fx.GraphModule(traced, graph)
    return nn.Sequential(blocks)


def block_modules(model: nn.Module, graph: _Graph, cuts: Sequence[Cut]) -> list[list[str]]:
    """Per block, the :func:`candidates` that run in it, in module order: what
    torchtitan calls a model part's module FQNs. A candidate cut inside (an explicit cut
    at one of its submodules) is listed in every block it runs in. O(N + K)."""
    bounds = [c.position for c in cuts]
    out: list[list[str]] = [[] for _ in range(len(cuts) + 1)]
    for fqn in candidates(model):
        if fqn in graph.start:
            first = sum(b <= graph.start[fqn] for b in bounds)
            last = sum(b <= graph.end[fqn] for b in bounds)
            for k in range(first, last + 1):
                out[k].append(fqn)
    return out


def _split(
    model: nn.Module, split: str | Sequence[str], source: str
) -> tuple[nn.Sequential, list[str], list[list[str]]]:
    """The chain, its cut FQNs and its blocks' modules (:func:`block_modules`)."""
    traced = trace(model, source)
    graph = _Graph(traced)
    cuts = find_cuts(graph, model, split, source)
    first = next((m for n in graph.nodes for m in _modules_of(n)[:1]), "forward")
    blocks = build_blocks(traced, cuts, first, source)
    return blocks, [c.fqn for c in cuts], block_modules(model, graph, cuts)


def split_module(
    model: nn.Module, split: str | Sequence[str], source: str = "model"
) -> tuple[nn.Sequential, list[str]]:
    """``model`` as a chain of blocks cut at ``split`` (``"auto"`` or FQNs), and the FQNs
    it was cut at (what :func:`chain` takes to rebuild it). Refusals are
    :class:`~planner.errors.InputError` naming ``source``. The blocks share ``model``'s
    parameters. O(K x N) in graph nodes N and candidates K."""
    blocks, cuts, _ = _split(model, split, source)
    return blocks, cuts


def _make(factory: str, seed: int) -> nn.Module:
    """``factory()`` under torch's RNG seeded with ``seed``; the caller's RNG is kept."""
    make = zoo.load_callable(factory)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = make()
    if not isinstance(model, nn.Module):
        raise InputError(factory, "", f"returned {type(model).__name__}; return an nn.Module")
    return model


def chain(
    factory: str, split: str | list[str] = AUTO, seed: int = 0,
    modules: list[list[str]] | None = None,
) -> nn.Sequential:
    """Build ``factory`` (``package.module:callable`` returning an ``nn.Module``) with
    torch's RNG seeded with ``seed`` (:func:`_make`) and split it at ``split``
    (:func:`split_module`). The rebuild entry of split profiles (:data:`BUILDER`);
    ``modules``, the profile's :func:`block_modules`, must be what the model gives now
    (else it changed since it was profiled). O(the factory + the split)."""
    blocks, _, found = _split(_make(factory, seed), split, factory)
    if modules is not None and found != modules:
        raise InputError(
            factory, "", f"its blocks now run modules {found}, but the profile says "
            f"{modules}; the model changed since it was profiled: profile it again"
        )
    return blocks


def split_source(factory: str, split: str, seed: int = 0) -> tuple[nn.Sequential, BuildSpec]:
    """``--model FACTORY --split SPLIT`` (``auto`` or comma-separated FQNs): the chain
    and the build spec that rebuilds it with its cuts resolved, so that ``auto`` is
    decided once, at profiling. O(the factory + the split)."""
    fqns = split if split == AUTO else [s.strip() for s in split.split(",") if s.strip()]
    if not fqns:
        raise InputError("--split", "", "give 'auto' or module FQNs separated by commas")
    blocks, cuts, modules = _split(_make(factory, seed), fqns, factory)
    build = BuildSpec(
        callable=BUILDER,
        kwargs={"factory": factory, "split": cuts, "seed": seed, "modules": modules},
    )
    return blocks, build
