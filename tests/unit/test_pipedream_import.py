"""Specification of planner.inputs.importers.pipedream: the graph.txt format, the DAG-to-chain
cut rule (worked by hand on small graphs and on the four shipped PipeDream profiles) and
the InputError contract for malformed files."""

from __future__ import annotations

import contextlib
import json
import random
import re
from pathlib import Path

import pytest
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.importers.pipedream import import_pipedream, parse_pipedream
from edgepipe.planner.inputs.profile import Block, ModelProfile, Timing
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.paths import REPO
from tests.helpers.pipedream_text import node

DATA = REPO / "profiles" / "raw" / "pipedream"
MODELS = REPO / "profiles" / "models"
#: profiled minibatch per model, read off the Input node (602,112 bytes = one 3x224x224
#: fp32 image): alexnet/resnet18/squeezenet1_0 were profiled at 256, vgg16 at 128
BATCH = {"alexnet": 256, "vgg16": 128, "resnet18": 256, "squeezenet1_0": 256}


def graph(model: str) -> Path:
    """The raw PipeDream file of ``model`` (profiles/raw/pipedream, in the repository)."""
    path = DATA / f"{model}.graph.txt"
    assert path.is_file(), f"{path} missing from the repository"
    return path


def graph_text(nodes: list[str], edges: list[tuple[str, str]]) -> str:
    """A graph.txt: the ``nodes`` lines (:func:`node`), then a tab-indented
    ``src -- dst`` line per edge, in order."""
    return "\n".join([*nodes, *(f"\t{src} -- {dst}" for src, dst in edges)])


#: Input -> conv -> {left, right} -> add: a residual-style diamond, profiled at batch 4.
DIAMOND = graph_text(
    [
        node("node1", "Input", 9.0, 0.0, 12.0, 0.0),
        node("node2", "Conv2d(3, 8, kernel_size=(3, 3))", 1.0, 2.0, 40.0, 100.0),
        node("node3", "Conv2d(8, 8, kernel_size=(1, 1))", 0.5, 1.0, 20.0, 10.0),
        node("node4", "ReLU(inplace)", 0.25, 0.5, 8.0, 0.0),
        node("node5", "Add(inplace)", 0.125, 0.25, 40.0, 6.0),
    ],
    [
        ("node1", "node2"),
        ("node2", "node3"),
        ("node2", "node4"),
        ("node3", "node5"),
        ("node4", "node5"),
    ],
)


def structure(p: ModelProfile) -> list[tuple[object, ...]]:
    t = next(iter(p.timings.values()))
    return [
        (
            frozenset(b.members),
            b.name,
            b.param_bytes,
            b.output_bytes_per_sample,
            b.saved_bytes_per_sample,
            t.forward_ms[i],
            t.backward_ms[i],
        )
        for i, b in enumerate(p.blocks)
    ]


# -- hand-worked graphs ------------------------------------------------------------------


def test_diamond_offers_a_boundary_between_every_layer_with_crossing_sums() -> None:
    p = parse_pipedream(DIAMOND, "diamond.txt", batch_size=4, device_type="dev", name="d")
    # order node2, node3, node4, node5; crossing bytes (minibatch of 4):
    #   after node2: node2's 40 (read by node3 and node4) = 40
    #   after node3: node2's 40 (node4 still to come) + node3's 20 = 60
    #   after node4: node3's 20 + node4's 8 (both read by node5) = 28
    assert [b.members for b in p.blocks] == [("node2",), ("node3",), ("node4",), ("node5",)]
    assert [b.name for b in p.blocks] == ["Conv2d-node2", "Conv2d-node3", "ReLU-node4", "Add-node5"]
    assert [b.param_bytes for b in p.blocks] == [100.0, 10.0, 0.0, 6.0]
    assert [b.output_bytes_per_sample for b in p.blocks] == [10.0, 15.0, 7.0, 10.0]
    assert [b.saved_bytes_per_sample for b in p.blocks] == [10.0, 5.0, 2.0, 10.0]
    assert p.input_bytes_per_sample == 3.0  # 12 / 4; the Input's 9 ms load time is dropped
    t = p.timings["dev"]
    assert t.batch_sizes == (4,)
    assert t.source == "imported"
    assert t.forward_ms == ((1.0,), (0.5,), (0.25,), (0.125,))
    assert t.backward_ms == ((2.0,), (1.0,), (0.5,), (0.25,))
    assert p.name == "d"
    assert p.source == {
        "kind": "imported",
        "detail": "PipeDream graph.txt diamond.txt, batch 4, device type dev",
        "tool": "edgepipe import-pipedream",
    }
    assert ModelProfile.from_dict(p.to_dict()) == p


#: an encoder-decoder whose skip connections span the whole graph: e1 feeds d1 (the last
#: layer), e2 feeds d2; no single node separates it, so dominator cuts give one block
SPANNING = graph_text(
    [
        node("in", "Input", 0, 0, 8, 0),
        node("e1", "Conv2d()", 2, 4, 16, 1e8),
        node("e2", "Conv2d()", 2, 4, 8, 1e8),
        node("mid", "Conv2d()", 2, 4, 4, 1e8),
        node("d2", "Upsample()", 2, 4, 8, 1e8),
        node("d1", "Upsample()", 2, 4, 16, 1e8),
    ],
    [
        ("in", "e1"),
        ("e1", "e2"),
        ("e2", "mid"),
        ("mid", "d2"),
        ("e2", "d2"),
        ("d2", "d1"),
        ("e1", "d1"),
    ],
)


def test_skip_connections_spanning_the_graph_leave_every_boundary_cuttable() -> None:
    p = parse_pipedream(SPANNING, "unet.txt", batch_size=4)
    assert [b.members for b in p.blocks] == [("e1",), ("e2",), ("mid",), ("d2",), ("d1",)]
    # crossing bytes (minibatch of 4): after e1: e1 16; after e2: e1 16 + e2 8;
    # after mid: e1 16 + e2 8 + mid 4; after d2: e1 16 + d2 8; d1 is the output
    outputs = [b.output_bytes_per_sample for b in p.blocks]
    assert outputs == [16 / 4, 24 / 4, 28 / 4, 24 / 4, 16 / 4]


def test_a_spanning_graph_plans_into_several_stages() -> None:
    from edgepipe.planner.inputs.cluster import Cluster, Device, Network
    from edgepipe.planner.inputs.config import TrainingConfig
    from edgepipe.planner.inputs.problem import make_problem
    from edgepipe.planner.solvers.dp.driver import plan_dp

    from tests.helpers.synthetic import device_type

    p = parse_pipedream(SPANNING, "unet.txt", batch_size=4, device_type="edge")
    # weights, gradients and momentum of one layer take 3e8 bytes: at most two per device
    kind = {"edge": device_type("edge", 7e8, 100.0, 1e4)}
    cluster = Cluster("four", tuple(Device(f"d{i}", "edge") for i in range(4)),
                      Network(1e4, 0.1, False), kind)  # fmt: skip
    # ring replicas off: the budget is sized for each device's own layers only
    config = TrainingConfig(16, (4,), replication_interval=0)
    problem = make_problem(p, cluster, config, catalog=kind)
    assert plan_dp(problem).partition.num_stages > 1


def test_a_batch_size_that_does_not_divide_the_input_is_refused() -> None:
    with pytest.raises(InputError, match="batch size 5 does not divide"):
        parse_pipedream(DIAMOND, "diamond.txt", batch_size=5)


def test_a_block_holding_most_of_the_time_is_reported() -> None:
    from edgepipe.planner.inputs.importers.pipedream import swallowing_block

    heavy = DIAMOND.replace("forward_compute_time=1.000", "forward_compute_time=90.000")
    warning = swallowing_block(parse_pipedream(heavy, "heavy.txt", batch_size=4))
    assert warning is not None and "block 0 (Conv2d-node2, 1 layers)" in warning
    assert swallowing_block(parse_pipedream(SPANNING, "unet.txt", batch_size=4)) is None


def test_pure_chain_gives_one_block_per_layer() -> None:
    text = graph_text(
        [
            node("n0", "Input", 0, 0, 8, 0),
            node("n1", "Linear(2, 2)", 1, 2, 16, 24),
            node("n2", "ReLU()", 0.5, 0.5, 16, 0),
            node("n3", "Linear(2, 1)", 1, 1, 8, 12),
        ],
        [("n0", "n1"), ("n1", "n2"), ("n2", "n3")],
    )
    p = parse_pipedream(text, "chain", batch_size=8)
    assert [b.members for b in p.blocks] == [("n1",), ("n2",), ("n3",)]
    assert [b.output_bytes_per_sample for b in p.blocks] == [2.0, 2.0, 1.0]
    assert list(p.timings) == ["v100"]  # the default device type


def test_outputs_nothing_consumes_cross_no_boundary() -> None:
    text = graph_text(
        [
            node("a", "Conv2d()", 1, 1, 16, 4),
            node("b", "Linear()", 1, 1, 8, 2),  # main head: a sink
            node("c", "Linear()", 1, 1, 4, 2),  # auxiliary head
        ],
        [("a", "b"), ("a", "c")],
    )
    p = parse_pipedream(text, "two-heads", batch_size=4)
    assert [b.members for b in p.blocks] == [("a",), ("b",), ("c",)]
    # after b only a's output (read by c) crosses: the sink b sends nothing on
    assert [b.output_bytes_per_sample for b in p.blocks] == [4.0, 4.0, 1.0]
    assert p.input_bytes_per_sample == 0.0  # no Input node


def two_sources(z_bytes: float) -> str:
    """Two 4-byte embeddings ``x`` and ``y`` added by ``z`` (no time, no parameters,
    ``z_bytes`` of output), which the linear layer ``w`` reads."""
    return graph_text(
        [
            node("x", "Embedding()", 1, 1, 4, 8),
            node("y", "Embedding()", 1, 1, 4, 8),
            node("z", "Add()", 0, 0, z_bytes, 0),
            node("w", "Linear()", 1, 1, 4, 8),
        ],
        [("x", "z"), ("y", "z"), ("z", "w")],
    )


def test_a_node_that_costs_nothing_joins_the_side_with_fewer_bytes() -> None:
    text = two_sources(z_bytes=4)  # z: no time, no parameters
    p = parse_pipedream(text, "two-sources", batch_size=1)
    # before z: x's 4 + y's 4 = 8 bytes cross; after z: z's 4, so z joins y's block
    assert [b.members for b in p.blocks] == [("x",), ("y", "z"), ("w",)]
    assert [b.output_bytes_per_sample for b in p.blocks] == [4.0, 4.0, 4.0]


def test_input_edges_do_not_pin_the_graph_together() -> None:
    # a second Input feeding a late layer must not fuse everything before it
    text = graph_text(
        [
            node("i0", "Input0", 0, 0, 4, 0),
            node("i1", "Input1", 0, 0, 12, 0),
            node("a", "Linear()", 1, 1, 4, 1),
            node("b", "Linear()", 1, 1, 4, 1),
            node("c", "Attention()", 1, 1, 4, 1),
        ],
        [("i0", "a"), ("a", "b"), ("b", "c"), ("i1", "c")],
    )
    p = parse_pipedream(text, "inputs", batch_size=4)
    assert [b.members for b in p.blocks] == [("a",), ("b",), ("c",)]
    assert p.input_bytes_per_sample == 4.0  # (4 + 12) / 4: all inputs


def test_whitespace_variants_parse_identically() -> None:
    reference = parse_pipedream(DIAMOND, "d", batch_size=4)
    for indent in ("\t", "    ", " \t", "\t ", ""):
        text = "\n".join(
            (indent + ln.strip()) if " -- node" in ln and "=" not in ln else ln
            for ln in DIAMOND.splitlines()
        )
        assert parse_pipedream(text, "d", batch_size=4) == reference, repr(indent)
    crlf = "\r\n".join(ln + "  " for ln in DIAMOND.splitlines()) + "\r\n\r\n"
    assert parse_pipedream(crlf, "d", batch_size=4) == reference
    blank_lines = "\n\n" + DIAMOND.replace("\n", "\n\n") + "\n"
    assert parse_pipedream(blank_lines, "d", batch_size=4) == reference


def test_layer_repr_with_separator_stage_id_and_list_activation() -> None:
    text = "\n".join(
        [
            "n1 -- Input -- forward_compute_time=0.000, backward_compute_time=0.000, "
            "activation_size=8.0, parameter_size=0.000 -- stage_id=0",
            "n2 -- Weird(a -- b) -- forward_compute_time=1.500, backward_compute_time=2.500, "
            "activation_size=[6.0; 2.0; 8.0], parameter_size=4.000 -- stage_id=1",
            "\tn1 -- n2",
        ]
    )
    p = parse_pipedream(text, "odd", batch_size=2)
    assert [b.name for b in p.blocks] == ["Weird-n2"]
    assert p.blocks[0].output_bytes_per_sample == 8.0  # (6 + 2 + 8) / 2
    assert p.timings["v100"].forward_ms == ((1.5,),)


def test_blocks_follow_a_topological_order_whatever_the_line_order() -> None:
    lines = SPANNING.splitlines()
    edges = [tuple(x.split(" -- ")) for x in lines if x.startswith("\t")]
    rng = random.Random(7)
    for _ in range(20):
        rng.shuffle(lines)
        p = parse_pipedream("\n".join(lines), "d", batch_size=4)
        where = {m: i for i, b in enumerate(p.blocks) for m in b.members}
        assert all(where[a.strip()] <= where[b] for a, b in edges if a.strip() != "in")
        assert sum(b.param_bytes for b in p.blocks) == 5e8


def test_default_names_follow_the_path(tmp_path: Path) -> None:
    (tmp_path / "resnet50").mkdir()
    (tmp_path / "resnet50" / "graph.txt").write_text(DIAMOND)
    (tmp_path / "mynet.graph.txt").write_text(DIAMOND)
    assert import_pipedream(tmp_path / "resnet50" / "graph.txt", batch_size=4).name == "resnet50"
    p = import_pipedream(tmp_path / "mynet.graph.txt", batch_size=4)
    assert p.name == "mynet"
    assert p.source["detail"] == "PipeDream graph.txt mynet.graph.txt, batch 4, device type v100"


# -- malformed input ----------------------------------------------------------------------

GOOD = node("n1", "Linear()", 1, 1, 4, 4)

MALFORMED = [
    ("", "line 1", "empty"),
    ("  \n\t\n", "line 1", "empty"),
    (f"{GOOD}\nhello world", "line 2", "cannot parse"),
    (f"{GOOD}\n\tn1 -- n9", "line 2", "n9"),
    (
        f"{GOOD}\n" + node("n2", "ReLU()", 1, 1, 4, 0) + "\n\tn1 -- n2\n\tn2 -- n1",
        ("line 3", "line 4"),
        "cycle",
    ),  # either edge of the 2-cycle may be named
    (f"{GOOD}\n\tn1 -- n1", "line 2", "cycle"),
    (
        node("n1", "Linear()", 1, 1, 4, 4).replace("parameter_size=4.000", "parameter_size=-4"),
        "line 1",
        "negative",
    ),
    (node("n1", "Linear()", 1, 1, 4, 4).replace("=1.000", "=abc", 1), "line 1", "not a number"),
    (node("n1", "Linear()", 1, 1, 4, 4).replace("=1.000", "=nan", 1), "line 1", "finite"),
    (
        "n1 -- Linear() -- forward_compute_time=1.0, backward_compute_time=1.0, "
        "activation_size=4.0",
        "line 1",
        "parameter_size",
    ),
    (f"{GOOD}\n{GOOD}", "line 2", "defined again"),
    (node("i", "Input", 0, 0, 4, 0) + f"\n{GOOD}\n\tn1 -- i", "line 3", "Input"),
    (node("i", "Input", 0, 0, 4, 0), "line 1", "only Input"),
    ("\tn1 -- n2", "line 1", "n1"),
    (
        "n1 -- -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=4.0, "
        "parameter_size=0.0",
        "line 1",
        "cannot parse",
    ),
    (GOOD + " -- trailing junk", "line 1", "unexpected text"),
]


@pytest.mark.parametrize(("text", "where", "needle"), MALFORMED)
def test_malformed_input_raises_input_error(
    text: str, where: str | tuple[str, ...], needle: str
) -> None:
    with pytest.raises(InputError) as err:
        parse_pipedream(text, "bad.txt")
    assert err.value.source == "bad.txt"
    assert err.value.path in ((where,) if isinstance(where, str) else where)
    assert needle.lower() in err.value.problem.lower()


def test_bad_arguments_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="batch size"):
        parse_pipedream(GOOD, "x", batch_size=0)
    with pytest.raises(InputError, match="file not found"):
        import_pipedream(tmp_path / "nope.txt")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="UTF-8"):
        import_pipedream(tmp_path / "bin.txt")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mangled_files_raise_only_input_error(data: st.DataObject) -> None:
    text = DIAMOND
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 12)))
        text = text[:i] + data.draw(st.text(max_size=6)) + text[j:]
    with contextlib.suppress(InputError):  # anything else fails the test
        parse_pipedream(text, "fuzz", batch_size=4)


# -- the shipped PipeDream profiles --------------------------------------------------------


def _raw_nodes(model: str) -> list[dict[str, float | str]]:
    out = []
    for line in graph(model).read_text().splitlines():
        m = re.match(
            r"(\S+) -- (.*) -- forward_compute_time=([\d.]+), backward_compute_time=([\d.]+), "
            r"activation_size=([\d.]+), parameter_size=([\d.]+)$",
            line,
        )
        if m:
            out.append(
                {
                    "id": m[1],
                    "desc": m[2],
                    "f": float(m[3]),
                    "b": float(m[4]),
                    "a": float(m[5]),
                    "p": float(m[6]),
                }
            )
    return out


def _import(model: str) -> ModelProfile:
    return import_pipedream(graph(model), batch_size=BATCH[model])


@pytest.mark.parametrize(
    ("model", "nodes", "blocks"),
    [
        # one block per layer, except that of the boundaries next to a run of free
        # layers (no time, no parameters, output read by a later layer) only the one
        # with the fewest bytes is kept: a run of k layers removes k boundaries.
        # alexnet: 22 layers, runs Size-View-Dropout (3) and Dropout (1): 18
        ("alexnet", 23, 18),
        # vgg16: 40 layers, runs Size-View (2), Dropout (1), Dropout (1): 36
        ("vgg16", 41, 36),
        # resnet18: 70 layers; 8 Adds (no time recorded) and the Size-View pair: 60
        ("resnet18", 71, 60),
        # squeezenet1_0: 67 layers; runs of 7 Concats, Concat-Dropout (2) and Size (1;
        # the View after it is the model's output, a sink, never free): 57
        ("squeezenet1_0", 68, 57),
    ],
)
def test_block_counts_and_conservation(model: str, nodes: int, blocks: int) -> None:
    raw = _raw_nodes(model)
    assert len(raw) == nodes
    p = _import(model)
    assert p.num_blocks == blocks
    layers = [n for n in raw if not str(n["desc"]).startswith("Input")]
    members = [m for b in p.blocks for m in b.members]
    assert sorted(members) == sorted(str(n["id"]) for n in layers)  # each layer exactly once
    t = p.timings["v100"]
    assert sum(b.param_bytes for b in p.blocks) == pytest.approx(sum(n["p"] for n in layers))
    assert sum(r[0] for r in t.forward_ms) == pytest.approx(sum(n["f"] for n in layers))
    assert sum(r[0] for r in t.backward_ms) == pytest.approx(sum(n["b"] for n in layers))
    batch = BATCH[model]
    saved = sum(b.saved_bytes_per_sample for b in p.blocks)
    assert saved == pytest.approx(sum(n["a"] for n in layers) / batch)
    assert p.input_bytes_per_sample == 3 * 224 * 224 * 4  # one fp32 ImageNet image
    assert p.blocks[-1].output_bytes_per_sample == 1000 * 4  # the logits


def test_vgg16_is_a_chain_with_its_free_layers_fused() -> None:
    p = _import("vgg16")
    multi = [b.members for b in p.blocks if len(b.members) > 1]
    # the Size(0)/View(-1) flatten pair: before it the pool's output crosses (Size and
    # View read it), between them that + Size's 4 bytes, after it View's copy of the
    # same size: the tie goes to the earliest, so the pair joins the Linear after it;
    # each Dropout joins the Linear after it (the same bytes cross on either side)
    assert multi == [("node33", "node34", "node35"), ("node37", "node38"), ("node40", "node41")]
    assert p.blocks[0].name == "Conv2d-node2"
    assert p.blocks[0].output_bytes_per_sample == 64 * 224 * 224 * 4


def test_resnet18_residual_units_can_be_cut_inside() -> None:
    p = _import("resnet18")
    units = [b for b in p.blocks if b.name.startswith("Add-")]
    assert len(units) == 8 and all(len(b.members) == 2 for b in units)
    # the first unit: maxpool node5 feeds conv node6 and the Add node11; inside the unit
    # both the skip tensor and the branch's tensor cross (64x56x56 fp32 each)
    names = [b.members for b in p.blocks]
    first = names.index(("node5",))
    assert names[first + 1 : first + 6] == [
        ("node6",), ("node7",), ("node8",), ("node9",), ("node10", "node11"),
    ]  # fmt: skip
    tensor = 64 * 56 * 56 * 4
    outputs = [b.output_bytes_per_sample for b in p.blocks[first : first + 6]]
    assert outputs == [tensor, 2 * tensor, 2 * tensor, 2 * tensor, 2 * tensor, tensor]


@pytest.mark.parametrize("model", sorted(BATCH))
def test_shipped_profile_matches_a_fresh_import_and_round_trips(model: str) -> None:
    path = MODELS / f"pipedream-{model}.json"
    shipped = ModelProfile.load(path)
    assert ModelProfile.from_dict(shipped.to_dict()) == shipped
    assert json.loads(path.read_text()) == shipped.to_dict()
    fresh = import_pipedream(graph(model), batch_size=BATCH[model], name=f"pipedream-{model}")
    assert fresh == shipped, "re-run benchmarks/import_pipedream_profiles.py"


@pytest.mark.parametrize("model", sorted(BATCH))
def test_shipped_profiles_round_trip_without_the_data(model: str) -> None:
    p = ModelProfile.load(MODELS / f"pipedream-{model}.json")
    assert ModelProfile.from_dict(p.to_dict()) == p
    assert p.source["kind"] == "imported"
    assert list(p.timings) == ["v100"]
    assert p.timings["v100"].batch_sizes == (BATCH[model],)


# -- fusing free layers loses no plan ----------------------------------------------------


def test_a_free_layers_saved_bytes_are_charged_to_the_layer_that_reads_it() -> None:
    text = two_sources(z_bytes=6)  # z is free (no time, no parameters) and w reads it
    p = parse_pipedream(text, "two-sources", batch_size=1)
    # z joins y's block (6 bytes cross after z, 8 before), but its 6 bytes are held by
    # w, which reads them: on whichever side of a cut z lands, w's stage keeps them
    assert [b.members for b in p.blocks] == [("x",), ("y", "z"), ("w",)]
    assert [b.saved_bytes_per_sample for b in p.blocks] == [4.0, 4.0, 6.0 + 4.0]


def test_a_run_of_free_layers_keeps_only_its_cheapest_boundary() -> None:
    text = graph_text(
        [
            node("pool", "MaxPool2d()", 1, 1, 40, 0),
            node("size", "Size(0)", 0, 0, 1, 0),  # free, read by view
            node("view", "View(-1)", 0, 0, 40, 0),  # free, read by fc
            node("drop", "Dropout()", 0, 0, 40, 0),  # free, read by fc
            node("fc", "Linear()", 2, 2, 8, 16),
        ],
        [("pool", "size"), ("pool", "view"), ("size", "view"), ("view", "drop"), ("drop", "fc")],
    )
    p = parse_pipedream(text, "flatten", batch_size=1)
    # boundaries next to the run size, view, drop: after pool 40 (pool read by size and
    # view), after size 40 + 1, after view 40, after drop 40: the earliest 40 is kept
    assert [b.members for b in p.blocks] == [("pool",), ("size", "view", "drop", "fc")]
    assert [b.output_bytes_per_sample for b in p.blocks] == [40.0, 8.0]
    # size's byte goes to view, view's to drop, drop's to fc: fc keeps all three
    assert [b.saved_bytes_per_sample for b in p.blocks] == [40.0, 1.0 + 40 + 40 + 8]


def test_a_free_layer_whose_output_nothing_reads_pins_its_boundaries() -> None:
    text = graph_text(
        [
            node("a", "LSTM()", 1, 1, 16, 4),
            node("h", "Getitem(1)", 0, 0, 8, 0),  # an unused tuple output: a sink
            node("b", "Linear()", 1, 1, 8, 2),
            node("c", "Linear()", 1, 1, 4, 2),
        ],
        [("a", "h"), ("a", "b"), ("b", "c")],
    )
    p = parse_pipedream(text, "tuple", batch_size=4)
    # h costs nothing but keeps its own bytes, so it is not free: nothing fuses
    assert [b.members for b in p.blocks] == [("a",), ("h",), ("b",), ("c",)]
    assert [b.output_bytes_per_sample for b in p.blocks] == [4.0, 4.0, 2.0, 1.0]
    assert [b.saved_bytes_per_sample for b in p.blocks] == [4.0, 2.0, 2.0, 1.0]


def _random_dag(rng: random.Random, layers: int) -> tuple[str, list[tuple[str, str]]]:
    """A random branchy graph.txt of ``layers`` layers after one Input: every layer
    reads one or two earlier ones, about a third cost nothing (free unless a sink)."""
    lines = [node("in", "Input", 0, 0, 4 * rng.randint(1, 8), 0)]
    edges = [("in", "n0")]
    for i in range(layers):
        free = i > 0 and rng.random() < 0.35
        f, b = (0, 0) if free else (rng.randint(1, 9), rng.randint(1, 18))
        par = 0 if free else 1e5 * rng.randint(1, 40)
        lines.append(node(f"n{i}", "Free()" if free else "Conv2d()", f, b,
                          1e5 * rng.randint(1, 30), par))  # fmt: skip
        if i:
            for j in sorted(set(rng.sample(range(i), min(i, rng.randint(1, 2))))):
                edges.append((f"n{j}", f"n{i}"))
    text = graph_text(lines, edges)
    return text, edges


def _node_by_node(text: str, fused: ModelProfile, edges: list[tuple[str, str]]) -> ModelProfile:
    """Oracle: the same graph with a block per layer and a boundary after every position
    of the importer's order, worked out from the definitions by enumeration (crossing
    bytes: every output read on both sides; a free layer's bytes held by its earliest
    reader, through free readers)."""
    raw = {}
    for line in text.splitlines():
        m = re.match(
            r"(\S+) -- \S+ -- forward_compute_time=([\d.]+), backward_compute_time="
            r"([\d.]+), activation_size=([\d.]+), parameter_size=([\d.]+)$",
            line,
        )
        if m and m[1] != "in":
            raw[m[1]] = tuple(float(m[i]) for i in range(2, 6))
    order = [m for b in fused.blocks for m in b.members]
    at = {v: i for i, v in enumerate(order)}
    readers = {v: sorted((b for a, b in edges if a == v), key=at.__getitem__) for v in order}
    assert all(at[a] < at[b] for a, b in edges if a != "in")  # the order is topological

    def free(v: str) -> bool:
        f, b, _, par = raw[v]
        return f == b == par == 0 and bool(readers[v])

    def keeper(v: str) -> str:
        return keeper(readers[v][0]) if free(v) else v

    saved = {v: sum(raw[u][2] for u in order if keeper(u) == v) for v in order}
    cross = [
        sum(raw[u][2] for u in order[: i + 1] if any(at[r] > i for r in readers[u]))
        for i in range(len(order) - 1)
    ] + [sum(raw[u][2] for u in order if not readers[u])]
    batch = fused.timings["edge"].batch_sizes[0]
    blocks = tuple(Block(v, raw[v][3], cross[i] / batch, saved[v] / batch)
                   for i, v in enumerate(order))  # fmt: skip
    timing = Timing((batch,), tuple((raw[v][0],) for v in order),
                    tuple((raw[v][1],) for v in order), source="imported")  # fmt: skip
    return ModelProfile("unfused", fused.source, fused.input_bytes_per_sample, blocks,
                        {"edge": timing})  # fmt: skip


def _problem(profile: ModelProfile, memory: tuple[float, float], devices: int):
    from edgepipe.planner.inputs.cluster import Cluster, Device, Network
    from edgepipe.planner.inputs.config import TrainingConfig
    from edgepipe.planner.inputs.problem import make_problem

    from tests.helpers.synthetic import device_type

    kinds = {"edge": device_type("edge", memory[0], 100.0, 1e4),
             "slow": device_type("slow", memory[1], 40.0, 1e4)}  # fmt: skip
    cluster = Cluster("mixed", tuple(Device(f"d{i}", ("edge", "slow")[i % 2])
                                     for i in range(devices)),
                      Network(1000.0, 0.5, False), kinds)  # fmt: skip
    config = TrainingConfig(4, (1, 2), replication_interval=0)
    return make_problem(profile, cluster, config, catalog=kinds)


@pytest.mark.parametrize("seed", range(24))
def test_fusing_free_layers_keeps_the_exact_optimum(seed: int) -> None:
    """Brute force over every plan (cuts, device groups, sample splits, micro-batch) of
    the node-by-node graph and of the imported one: the same optimum, or both
    infeasible; memory is drawn tight so that where saved bytes fall matters."""
    from tests.helpers.oracles import brute_force_best

    rng = random.Random(seed)
    text, edges = _random_dag(rng, rng.randint(4, 6))
    fused = parse_pipedream(text, "dag", batch_size=2, device_type="edge")
    unfused = _node_by_node(text, fused, edges)
    # weights, gradients and momentum, plus three micro-batches of 2 in flight
    whole = sum(3 * b.param_bytes + 6 * b.saved_bytes_per_sample for b in unfused.blocks)
    memory = (whole * rng.uniform(0.2, 0.8), whole * rng.uniform(0.2, 0.8))
    best_unfused = brute_force_best(_problem(unfused, memory, 3))[0]
    best_fused = brute_force_best(_problem(fused, memory, 3))[0]
    assert best_fused == pytest.approx(best_unfused, rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_fusing_free_layers_keeps_the_dps_optimum(seed: int) -> None:
    """The DP (the planner users run) on 12-16 layer graphs over four mixed devices:
    the same best iteration time on the node-by-node graph and on the imported one."""
    from edgepipe.planner.errors import InfeasibleError
    from edgepipe.planner.solvers.dp.driver import plan_dp

    rng = random.Random(1000 + seed)
    text, edges = _random_dag(rng, rng.randint(12, 16))
    fused = parse_pipedream(text, "dag", batch_size=2, device_type="edge")
    unfused = _node_by_node(text, fused, edges)
    assert fused.num_blocks < unfused.num_blocks
    whole = sum(3 * b.param_bytes + 6 * b.saved_bytes_per_sample for b in unfused.blocks)
    memory = (whole * rng.uniform(0.2, 0.6), whole * rng.uniform(0.2, 0.6))
    best = []
    for profile in (unfused, fused):
        try:
            best.append(plan_dp(_problem(profile, memory, 4)).cost.iteration_ms)
        except InfeasibleError:
            best.append(float("inf"))
    assert best[1] == pytest.approx(best[0], rel=1e-12)


def test_the_cli_warns_of_a_swallowing_block_and_refuses_a_contradicting_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from edgepipe.planner.cli.main import main

    heavy = tmp_path / "heavy.graph.txt"
    heavy.write_text(DIAMOND.replace("forward_compute_time=1.000", "forward_compute_time=90.000"))
    out = tmp_path / "m.json"
    assert main(["import-pipedream", str(heavy), "--batch-size", "4", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    # (90 + 2) of 90 + 2 + 1.5 + 0.75 + 0.375 ms
    assert "warning: block 0 (Conv2d-node2, 1 layers) holds 97% of the model's time" in err
    bad = ["import-pipedream", str(heavy), "--batch-size", "5", "-o", str(tmp_path / "x")]
    assert main(bad) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "batch size 5 does not divide" in lines[0]
    assert not (tmp_path / "x").exists()


def test_a_dense_400_layer_graph_keeps_one_block_per_working_layer() -> None:
    from tests.helpers.synthetic import nasnet_like

    text = nasnet_like()  # 25 cells x 16 layers + stem + head; Adds and Concats free
    p = parse_pipedream(text, "nasnet-like", batch_size=32)
    lines = text.splitlines()
    free = {ln.split(" -- ")[0] for ln in lines if "Add()" in ln or "Concat" in ln}
    assert sum(len(b.members) for b in p.blocks) == 402 and len(free) == 25 * 6
    # between two consecutive working layers of the order exactly one boundary survives
    # (the one between them, or one of their free run's): with working layers first and
    # last (stem, head), every block holds exactly one working layer
    assert [sum(m not in free for m in b.members) for b in p.blocks] == [1] * 252
