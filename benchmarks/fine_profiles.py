"""DAG-shaped synthetic fine profiles: ResNet-, DenseNet- and Inception-like layer graphs
of 150-1,100 nodes, written as PipeDream ``graph.txt`` text and imported node by node
with the project's importer (:func:`planner.inputs.importers.pipedream.parse_pipedream`),
as the public PipeDream profiles of issue 29 are (none is downloaded).

Shapes imitate ``profiles/raw/pipedream``: every conv is followed by BatchNorm and ReLU
nodes, a residual block ends in a free ``Add`` (zero time, no parameters) read by a ReLU,
a dense layer's output is concatenated with all earlier features by a free ``Concat``,
an Inception module runs four branches from one input and concatenates them. Figures,
per profiled minibatch of ``BATCH`` samples at 224 x 224: a conv's forward time is its
multiply-accumulates x 2 / ``FLOPS`` (a V100-class rate), its backward twice that;
BatchNorm and ReLU move their activation at ``BYTES_PER_MS``; activations fp32.
Deterministic (no randomness).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgepipe.planner.inputs.importers.pipedream import parse_pipedream
from edgepipe.planner.inputs.profile import ModelProfile

#: profiled minibatch
BATCH = 32
#: FLOP per ms of a conv (10 TFLOP/s)
FLOPS = 1e10
#: bytes per ms a BatchNorm or ReLU streams (500 GB/s)
BYTES_PER_MS = 5e8
DEVICE_TYPE = "v100"


@dataclass
class _Graph:
    """Node and edge lines of a graph.txt; tensors are (node id, channels, side)."""

    lines: list[str] = field(default_factory=list)
    edges: list[str] = field(default_factory=list)
    count: int = 0

    def node(self, desc: str, inputs: list[str], channels: int, side: int, fwd: float,
             params: float, bwd_factor: float = 2.0) -> str:
        nid = f"node{self.count}"
        self.count += 1
        act = 4.0 * BATCH * channels * side * side
        self.lines.append(
            f"{nid} -- {desc} -- forward_compute_time={fwd:.4f}, "
            f"backward_compute_time={bwd_factor * fwd:.4f}, activation_size={act:.1f}, "
            f"parameter_size={params:.1f}"
        )
        self.edges += [f"\t{i} -- {nid}" for i in inputs]
        return nid

    def conv(self, x: str, cin: int, cout: int, k: int, side: int, stride: int = 1) -> str:
        out = side // stride
        macs = cin * cout * k * k * out * out * BATCH
        return self.node(f"Conv2d({cin}, {cout}, kernel_size=({k}, {k}))", [x], cout, out,
                         2.0 * macs / FLOPS, 4.0 * cin * cout * k * k)

    def elementwise(self, name: str, x: str, channels: int, side: int) -> str:
        act = 4.0 * BATCH * channels * side * side
        params = 8.0 * channels if name == "BatchNorm2d" else 0.0
        return self.node(f"{name}({channels})", [x], channels, side, act / BYTES_PER_MS, params)

    def cbr(self, x: str, cin: int, cout: int, k: int, side: int, stride: int = 1,
            relu: bool = True) -> str:
        """Conv, BatchNorm and (optionally) ReLU: three nodes."""
        y = self.conv(x, cin, cout, k, side, stride)
        y = self.elementwise("BatchNorm2d", y, cout, side // stride)
        return self.elementwise("ReLU", y, cout, side // stride) if relu else y

    def free(self, desc: str, inputs: list[str], channels: int, side: int) -> str:
        return self.node(desc, inputs, channels, side, 0.0, 0.0)

    def head(self, x: str, channels: int, side: int) -> None:
        y = self.node("AvgPool2d", [x], channels, 1, 4.0 * BATCH * channels * side * side
                      / BYTES_PER_MS, 0.0)
        y = self.free("View(-1)", [y], channels, 1)
        self.node(f"Linear(in_features={channels}, out_features=1000, bias=True)", [y], 1000, 1,
                  2.0 * channels * 1000 * BATCH / FLOPS, 4.0 * channels * 1000)

    def stem(self) -> tuple[str, int]:
        x = self.node("Input0", [], 3, 224, 0.0, 0.0)
        y = self.cbr(x, 3, 64, 7, 224, 2)
        return self.node("MaxPool2d", [y], 64, 56, 4.0 * BATCH * 64 * 112 * 112 / BYTES_PER_MS,
                         0.0), 56

    def text(self) -> str:
        return "\n".join(self.lines + self.edges) + "\n"


def resnet_like(layers: tuple[int, ...] = (3, 4, 23, 3)) -> str:
    """Bottleneck ResNet (resnet101: 3, 4, 23, 3 -> 344 nodes; resnet50: 3, 4, 6, 3)."""
    g = _Graph()
    x, side = g.stem()
    cin = 64
    for stage, blocks in enumerate(layers):
        width = 64 * 2**stage
        for b in range(blocks):
            stride = 2 if b == 0 and stage > 0 else 1
            y = g.cbr(x, cin, width, 1, side)
            y = g.cbr(y, width, width, 3, side, stride)
            y = g.cbr(y, width, 4 * width, 1, side // stride, relu=False)
            short = x
            if b == 0:
                short = g.cbr(x, cin, 4 * width, 1, side, stride, relu=False)
            side //= stride
            y = g.free("Add(inplace)", [y, short], 4 * width, side)
            x = g.elementwise("ReLU", y, 4 * width, side)
            cin = 4 * width
    g.head(x, cin, side)
    return g.text()


def densenet_like(layers: tuple[int, ...] = (6, 12, 24, 16), growth: int = 32) -> str:
    """DenseNet-BC (densenet121: 6, 12, 24, 16 -> 433 nodes; densenet201: 6, 12, 48, 32)."""
    g = _Graph()
    x, side = g.stem()
    channels = 64
    for stage, n in enumerate(layers):
        for _ in range(n):
            y = g.elementwise("BatchNorm2d", x, channels, side)
            y = g.elementwise("ReLU", y, channels, side)
            y = g.cbr(y, channels, 4 * growth, 1, side)
            y = g.conv(y, 4 * growth, growth, 3, side)
            channels += growth
            x = g.free("Concat(1)", [x, y], channels, side)
        if stage + 1 < len(layers):
            y = g.elementwise("BatchNorm2d", x, channels, side)
            y = g.elementwise("ReLU", y, channels, side)
            y = g.conv(y, channels, channels // 2, 1, side)
            channels //= 2
            side //= 2
            x = g.node("AvgPool2d", [y], channels, side, 4.0 * BATCH * channels * side * side
                       / BYTES_PER_MS, 0.0)
    g.head(x, channels, side)
    return g.text()


def inception_like(modules: tuple[int, ...] = (3, 5, 3), width: int = 64) -> str:
    """Inception-v3-like: per resolution ``modules[i]`` modules of four branches (1x1;
    1x1-3x3; 1x1-3x3-3x3; pool-1x1), a reduction between resolutions ((3, 5, 3): 11
    modules, 270 nodes; (12, 24, 12): 48 modules, 1,097)."""
    g = _Graph()
    x, side = g.stem()
    cin = 192
    x = g.cbr(x, 64, cin, 3, side)
    for stage, n in enumerate(modules):
        w = width * 2**stage
        for _ in range(n):
            a = g.cbr(x, cin, w, 1, side)
            b = g.cbr(g.cbr(x, cin, w, 1, side), w, w, 3, side)
            c = g.cbr(g.cbr(g.cbr(x, cin, w, 1, side), w, w, 3, side), w, w, 3, side)
            pool = g.node("AvgPool2d(3)", [x], cin, side,
                          4.0 * BATCH * cin * side * side / BYTES_PER_MS, 0.0)
            d = g.cbr(pool, cin, w, 1, side)
            cin = 4 * w
            x = g.free("Concat(1)", [a, b, c, d], cin, side)
        if stage + 1 < len(modules):
            x = g.cbr(x, cin, cin, 3, side, 2)
            side //= 2
    g.head(x, cin, side)
    return g.text()


#: name -> graph text builder; node counts 150-1,100
SHAPES = {
    "resnet50-like": lambda: resnet_like((3, 4, 6, 3)),
    "resnet101-like": lambda: resnet_like((3, 4, 23, 3)),
    "densenet121-like": lambda: densenet_like((6, 12, 24, 16)),
    "densenet201-like": lambda: densenet_like((6, 12, 48, 32)),
    "inception-like": lambda: inception_like((3, 5, 3)),
    "inception-large-like": lambda: inception_like((12, 24, 12)),
}


def profile(name: str) -> ModelProfile:
    """The shape ``name`` (:data:`SHAPES`) imported as the importer imports a PipeDream
    graph (node by node, free nodes fused where that loses no plan)."""
    return parse_pipedream(SHAPES[name](), f"{name}.graph.txt", batch_size=BATCH,
                           device_type=DEVICE_TYPE, name=name)


def node_count(name: str) -> int:
    return sum(1 for line in SHAPES[name]().splitlines() if not line.startswith("\t"))


if __name__ == "__main__":
    for shape in SHAPES:
        print(f"{shape}: {node_count(shape)} nodes, {profile(shape).num_blocks} blocks")
