"""Reading JSON documents and validating them once, at the boundary.

Every edgepipe document (model profile, device catalog, cluster, training config, plan)
carries ``schema_version`` and ``kind`` and is checked against its JSON Schema (draft
2020-12, shipped in ``schemas/``). Failures raise :class:`~planner.errors.InputError`
naming the file, the JSON path and the problem; nothing past this module re-validates.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from planner.errors import InputError, SchemaVersionError
from planner.resources import data_dir

SCHEMA_VERSION = 1

#: document kind -> schema file name
KINDS: dict[str, str] = {
    "edgepipe.model_profile": "model_profile.schema.json",
    "edgepipe.device_catalog": "device_catalog.schema.json",
    "edgepipe.cluster": "cluster.schema.json",
    "edgepipe.training_config": "training_config.schema.json",
    "edgepipe.plan": "plan.schema.json",
}

#: deepest JSON nesting accepted; edgepipe documents need fewer than 10 levels
MAX_DEPTH = 64


@cache
def _registry() -> Registry:
    resources = []
    for name in KINDS.values():
        schema = json.loads((data_dir("schemas") / name).read_text())
        resources.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources)


@cache
def _validator(kind: str) -> Draft202012Validator:
    schema = json.loads((data_dir("schemas") / KINDS[kind]).read_text())
    return Draft202012Validator(schema, registry=_registry())


def json_path(parts: Any) -> str:
    """Render a jsonschema path deque as ``$.a[0].b``."""
    out = "$"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON; write a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is too large; write a finite number")
    return value


def _depth(value: Any) -> int:
    depth, frontier = 0, [value]
    while frontier:
        depth += 1
        if depth > MAX_DEPTH:
            return depth
        nxt: list[Any] = []
        for item in frontier:
            if isinstance(item, dict):
                nxt.extend(item.values())
            elif isinstance(item, list):
                nxt.extend(item)
        frontier = nxt
    return depth


def parse_json(text: str | bytes, source: str) -> Any:
    """Parse JSON text, turning every parse failure into an :class:`InputError`."""
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(source, "", f"not valid JSON ({exc}); fix the syntax") from None
    except ValueError as exc:
        raise InputError(source, "", str(exc)) from None
    except RecursionError:
        raise InputError(source, "", f"JSON nested deeper than {MAX_DEPTH} levels") from None
    if _depth(value) > MAX_DEPTH:
        raise InputError(source, "", f"JSON nested deeper than {MAX_DEPTH} levels")
    return value


def read_json(path: str | Path) -> Any:
    """Read and parse a JSON file; a missing or unreadable file is an :class:`InputError`."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(str(p), "", "file not found; check the path") from None
    except OSError as exc:
        raise InputError(str(p), "", f"cannot read the file ({exc.strerror})") from None
    return parse_json(raw, str(p))


def validate(doc: Any, kind: str, source: str) -> dict[str, Any]:
    """Check ``doc`` is a valid document of ``kind``; return it unchanged.

    Raises:
        SchemaVersionError: ``schema_version`` is not the one this release reads.
        InputError: wrong kind, or the first schema violation (with its JSON path).
    """
    if not isinstance(doc, dict):
        raise InputError(source, "$", f"expected a JSON object ({kind}), got {type(doc).__name__}")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SchemaVersionError(
            source,
            "$.schema_version",
            f"schema version {version!r} is not supported; this edgepipe reads version "
            f"{SCHEMA_VERSION}. Re-create the file with this release or convert it.",
        )
    found = doc.get("kind")
    if found != kind:
        raise InputError(
            source, "$.kind", f"this is a {found!r} document, but a {kind!r} was expected"
        )
    errors = sorted(_validator(kind).iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        raise InputError(source, json_path(err.absolute_path), f"{err.message}{more}")
    return doc


def load_document(path: str | Path, kind: str) -> dict[str, Any]:
    """Read, parse and validate a document file of ``kind``."""
    return validate(read_json(path), kind, str(path))
