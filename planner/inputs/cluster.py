"""Device types, the device catalog and clusters.

A :class:`DeviceType` carries memory, compute and network figures (each with a public
source in the shipped catalog ``profiles/devices/catalog.json``). A :class:`Cluster`
lists devices (id, type, optional memory / usable-fraction / slowdown overrides) and the
network between them: a default bandwidth and latency, optional per-pair links, and its
topology (:data:`TOPOLOGIES`): dedicated full-duplex point-to-point links, a switch with
one full-duplex port per device, or one shared half-duplex medium (Wi-Fi, the
``shared_medium`` flag), where concurrent transfers share one channel.

Bandwidths are Mbit/s and latencies ms in files; :meth:`Cluster.bytes_per_ms` gives the
unit the cost model uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.resources import profile_path
from edgepipe.planner.inputs.schema import excerpt, load_document, validate

CATALOG_KIND = "edgepipe.device_catalog"
CLUSTER_KIND = "edgepipe.cluster"

Topology = Literal["point_to_point", "switched", "shared_medium"]
TOPOLOGIES: tuple[Topology, ...] = ("point_to_point", "switched", "shared_medium")


@dataclass(frozen=True)
class DeviceType:
    """A kind of device. ``efficiency`` is the fraction of peak FP32 throughput that DNN
    training reaches on it; ``peak_fp32_gflops * efficiency`` is its effective speed."""

    name: str
    description: str
    memory_bytes: float
    usable_fraction: float
    peak_fp32_gflops: float
    efficiency: float
    interface: str
    bandwidth_mbps: float
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def effective_gflops(self) -> float:
        return self.peak_fp32_gflops * self.efficiency

    def to_dict(self) -> dict[str, Any]:
        return {
            "description": self.description,
            "memory_bytes": self.memory_bytes,
            "usable_fraction": self.usable_fraction,
            "peak_fp32_gflops": self.peak_fp32_gflops,
            "efficiency": self.efficiency,
            "network": {"interface": self.interface, "bandwidth_mbps": self.bandwidth_mbps},
            "sources": dict(self.sources),
        }

    @classmethod
    def from_dict(cls, name: str, d: dict[str, Any]) -> DeviceType:
        return cls(
            name=name,
            description=d["description"],
            memory_bytes=d["memory_bytes"],
            usable_fraction=d["usable_fraction"],
            peak_fp32_gflops=d["peak_fp32_gflops"],
            efficiency=d["efficiency"],
            interface=d["network"]["interface"],
            bandwidth_mbps=d["network"]["bandwidth_mbps"],
            sources=dict(d["sources"]),
        )


def catalog_from_dict(doc: Any, source: str = "<device catalog>") -> dict[str, DeviceType]:
    """Validate a device catalog document and return its types by name."""
    validate(doc, CATALOG_KIND, source)
    return {n: DeviceType.from_dict(n, d) for n, d in doc["device_types"].items()}


def load_catalog(path: str | Path | None = None) -> dict[str, DeviceType]:
    """Load a device catalog (default: the shipped one)."""
    if path is None:
        return dict(_shipped_catalog())
    return catalog_from_dict(load_document(path, CATALOG_KIND), str(path))


@cache
def _shipped_catalog() -> dict[str, DeviceType]:
    path = profile_path("devices/catalog.json")
    return catalog_from_dict(load_document(path, CATALOG_KIND), str(path))


@dataclass(frozen=True)
class Device:
    """One device of a cluster; ``None`` overrides fall back to the type's figures."""

    id: str
    type: str
    memory_bytes: float | None = None
    usable_fraction: float | None = None
    slowdown: float = 1.0


@dataclass(frozen=True)
class Link:
    """Per-pair override of bandwidth (Mbit/s) and/or latency (ms); symmetric."""

    a: str
    b: str
    bandwidth_mbps: float | None = None
    latency_ms: float | None = None


@dataclass(frozen=True)
class Network:
    """Default pair bandwidth (Mbit/s) and latency (ms), per-pair overrides and the
    topology; ``topology`` None means ``shared_medium`` if that flag is set, else
    ``switched`` (the file's default). A topology given must agree with the flag
    (``shared_medium`` exactly when the topology is): the cost model reads the flag, the
    simulator and the channels the topology. Raises :class:`InputError` otherwise, as
    the cluster loader does for a file (:meth:`Cluster.from_dict`)."""

    bandwidth_mbps: float
    latency_ms: float
    shared_medium: bool = False
    links: tuple[Link, ...] = ()
    topology: Topology | None = None

    def __post_init__(self) -> None:
        if self.topology is not None and (self.topology == "shared_medium") != self.shared_medium:
            raise InputError("Network", "topology", f"topology {self.topology!r} contradicts "
                             f"shared_medium {self.shared_medium}; make them agree "
                             "(shared_medium=True exactly when topology='shared_medium')")

    @property
    def kind(self) -> Topology:
        """The resolved topology."""
        if self.topology is not None:
            return self.topology
        return "shared_medium" if self.shared_medium else "switched"


@dataclass(frozen=True)
class Cluster:
    """Devices and the network between them; ``device_types`` holds every type used."""

    name: str
    devices: tuple[Device, ...]
    network: Network
    device_types: dict[str, DeviceType]
    description: str = ""
    # lookups derived in __post_init__: each link under both orders of its pair, and
    # every device id's index
    _links: dict[tuple[str, str], Link] = field(init=False, repr=False, compare=False)
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pairs: dict[tuple[str, str], Link] = {}
        for link in self.network.links:
            pairs[(link.a, link.b)] = link
            pairs[(link.b, link.a)] = link
        object.__setattr__(self, "_links", pairs)
        object.__setattr__(self, "_index", {d.id: i for i, d in enumerate(self.devices)})

    # -- lookups -------------------------------------------------------------------------
    def index(self, device_id: str) -> int:
        return self._index[device_id]

    def has_device(self, device_id: str) -> bool:
        return device_id in self._index

    def type_of(self, i: int) -> DeviceType:
        return self.device_types[self.devices[i].type]

    def memory_bytes(self, i: int) -> float:
        d = self.devices[i]
        return d.memory_bytes if d.memory_bytes is not None else self.type_of(i).memory_bytes

    def budget_bytes(self, i: int) -> float:
        """Usable memory of device ``i`` (total x usable fraction)."""
        d = self.devices[i]
        frac = d.usable_fraction
        if frac is None:
            frac = self.type_of(i).usable_fraction
        return self.memory_bytes(i) * frac

    def bandwidth_mbps(self, i: int, j: int) -> float:
        """Bandwidth between devices ``i`` and ``j``: the pair's link if given, else the
        network default capped by both devices' interfaces."""
        link = self._links.get((self.devices[i].id, self.devices[j].id))
        if link is not None and link.bandwidth_mbps is not None:
            return link.bandwidth_mbps
        return min(
            self.network.bandwidth_mbps,
            self.type_of(i).bandwidth_mbps,
            self.type_of(j).bandwidth_mbps,
        )

    def bytes_per_ms(self, i: int, j: int) -> float:
        """Bandwidth between ``i`` and ``j`` in bytes per millisecond."""
        return self.bandwidth_mbps(i, j) * 1e6 / 8 / 1e3

    def latency_ms(self, i: int, j: int) -> float:
        link = self._links.get((self.devices[i].id, self.devices[j].id))
        if link is not None and link.latency_ms is not None:
            return link.latency_ms
        return self.network.latency_ms

    # -- (de)serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        devices = []
        for d in self.devices:
            dd: dict[str, Any] = {"id": d.id, "type": d.type}
            if d.memory_bytes is not None:
                dd["memory_bytes"] = d.memory_bytes
            if d.usable_fraction is not None:
                dd["usable_fraction"] = d.usable_fraction
            if d.slowdown != 1.0:
                dd["slowdown"] = d.slowdown
            devices.append(dd)
        net: dict[str, Any] = {
            "bandwidth_mbps": self.network.bandwidth_mbps,
            "latency_ms": self.network.latency_ms,
            "shared_medium": self.network.shared_medium,
        }
        if self.network.topology is not None:
            net["topology"] = self.network.topology
        if self.network.links:
            links = []
            for link in self.network.links:
                ld: dict[str, Any] = {"a": link.a, "b": link.b}
                if link.bandwidth_mbps is not None:
                    ld["bandwidth_mbps"] = link.bandwidth_mbps
                if link.latency_ms is not None:
                    ld["latency_ms"] = link.latency_ms
                links.append(ld)
            net["links"] = links
        out: dict[str, Any] = {"schema_version": 1, "kind": CLUSTER_KIND, "name": self.name}
        if self.description:
            out["description"] = self.description
        out["device_types"] = {n: t.to_dict() for n, t in sorted(self.device_types.items())}
        out["devices"] = devices
        out["network"] = net
        return out

    @classmethod
    def from_dict(
        cls,
        doc: Any,
        source: str = "<cluster>",
        catalog: dict[str, DeviceType] | None = None,
    ) -> Cluster:
        """Validate ``doc`` and build the cluster; device types not embedded in it are
        taken from ``catalog`` (default: the shipped catalog)."""
        validate(doc, CLUSTER_KIND, source)
        embedded = {n: DeviceType.from_dict(n, d) for n, d in doc.get("device_types", {}).items()}
        known = {**(load_catalog() if catalog is None else catalog), **embedded}
        types: dict[str, DeviceType] = dict(embedded)
        devices = []
        seen: set[str] = set()
        for i, d in enumerate(doc["devices"]):
            if d["id"] in seen:
                raise InputError(
                    source,
                    f"$.devices[{i}].id",
                    f"device id {excerpt(repr(d['id']), 40)} is used twice; give every device a "
                    "unique id",
                )
            seen.add(d["id"])
            if d["type"] not in known:
                raise InputError(
                    source,
                    f"$.devices[{i}].type",
                    f"unknown device type {excerpt(repr(d['type']), 40)}; use one of "
                    f"{sorted(known)} or add "
                    "its spec under device_types",
                )
            types[d["type"]] = known[d["type"]]
            devices.append(
                Device(
                    id=d["id"],
                    type=d["type"],
                    memory_bytes=d.get("memory_bytes"),
                    usable_fraction=d.get("usable_fraction"),
                    slowdown=d.get("slowdown", 1.0),
                )
            )
        net = doc["network"]
        links = []
        for k, link in enumerate(net.get("links", [])):
            for end in ("a", "b"):
                if link[end] not in seen:
                    raise InputError(
                        source,
                        f"$.network.links[{k}].{end}",
                        f"link names device {excerpt(repr(link[end]), 40)}, which is not in "
                        "devices",
                    )
            links.append(
                Link(link["a"], link["b"], link.get("bandwidth_mbps"), link.get("latency_ms"))
            )
        topology = net.get("topology")
        try:  # Network checks that the topology and the flag agree
            network = Network(
                bandwidth_mbps=net["bandwidth_mbps"],
                latency_ms=net["latency_ms"],
                shared_medium=net.get("shared_medium", topology == "shared_medium"),
                links=tuple(links),
                topology=topology,
            )
        except InputError as exc:
            raise InputError(source, "$.network.topology", exc.problem) from None
        return cls(
            name=doc["name"],
            description=doc.get("description", ""),
            devices=tuple(devices),
            network=network,
            device_types=types,
        )

    @classmethod
    def load(cls, path: str | Path, catalog: dict[str, DeviceType] | None = None) -> Cluster:
        return cls.from_dict(load_document(path, CLUSTER_KIND), str(path), catalog)
