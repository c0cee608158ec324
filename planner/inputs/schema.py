"""Reading JSON documents and validating them once, at the boundary.

Every edgepipe document (model profile, device catalog, cluster, training config, plan)
carries ``schema_version`` and ``kind`` and is checked against its JSON Schema (draft
2020-12, shipped in ``schemas/``). Failures raise :class:`~planner.errors.InputError`
naming the file, the JSON path and the problem; nothing past this module re-validates.
"""

from __future__ import annotations

import json
import math
import os
import stat
from functools import cache
from pathlib import Path
from typing import Any

from edgepipe.planner.errors import InputError, SchemaVersionError
from edgepipe.planner.inputs.resources import data_dir
from jsonschema import Draft202012Validator, validators
from referencing import Registry, Resource

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
#: largest file read (a plan embedding a 1,000-block profile timed on 8 types is ~2 MB)
MAX_FILE_BYTES = 64 * 2**20


@cache
def _registry() -> Registry:
    resources = []
    for name in KINDS.values():
        schema = json.loads((data_dir("schemas") / name).read_text())
        resources.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources)


def _is_integer(_checker: Any, instance: Any) -> bool:
    # JSON Schema counts 16.0 as an integer; a count written as 16.0 is almost always a
    # computed value that was meant to be whole, and Python would carry it on as a float
    return isinstance(instance, int) and not isinstance(instance, bool)


#: draft 2020-12 with "integer" meaning a JSON number written without a fraction or exponent
StrictValidator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


@cache
def _validator(kind: str) -> Any:
    schema = json.loads((data_dir("schemas") / KINDS[kind]).read_text())
    return StrictValidator(schema, registry=_registry())


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


def ensure_regular_file(path: str | Path, limit: int = MAX_FILE_BYTES) -> Path:
    """``path`` if it is a regular file of at most ``limit`` bytes, else an
    :class:`InputError` (missing, unreadable, a directory, a FIFO or device that might
    never end, too large). Opens nothing."""
    p = Path(path)
    try:
        info = p.stat()
    except FileNotFoundError:
        raise InputError(str(p), "", "file not found; check the path") from None
    except OSError as exc:
        raise InputError(str(p), "", f"cannot read the file ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        what = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise InputError(str(p), "", f"is {what}; give the path of a file")
    if info.st_size > limit:
        raise InputError(
            str(p), "", f"is {info.st_size} bytes; edgepipe reads files of at most {limit} bytes"
        )
    return p


def read_bounded(path: str | Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (:func:`ensure_regular_file`)."""
    p = ensure_regular_file(path, limit)
    try:
        with p.open("rb") as f:
            raw = f.read(limit + 1)
    except OSError as exc:
        raise InputError(str(p), "", f"cannot read the file ({exc.strerror})") from None
    if len(raw) > limit:
        raise InputError(str(p), "", f"is over {limit} bytes; edgepipe reads at most that")
    return raw


def read_json(path: str | Path) -> Any:
    """Read and parse a JSON file (:func:`read_bounded`); errors are :class:`InputError`."""
    return parse_json(read_bounded(path), str(path))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, renamed into place;
    the temporary file is removed on any failure (also Ctrl-C), so nothing half-written
    is left. An OS failure (a directory there, a missing folder, no permission) is an
    :class:`InputError` naming the path."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(target)
    except OSError as exc:
        raise InputError(str(target), "", f"cannot write the file ({exc.strerror})") from None
    finally:
        tmp.unlink(missing_ok=True)


def excerpt(text: str, limit: int = 120) -> str:
    """``text`` cut to at most ``limit`` characters (an error message quotes no more)."""
    return text if len(text) <= limit else text[: limit - 5] + " ..."


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
            f"schema version {excerpt(repr(version), 40)} is not supported; this edgepipe "
            f"reads version {SCHEMA_VERSION}. Re-create the file with this release or convert it.",
        )
    found = doc.get("kind")
    if found != kind:
        raise InputError(
            source,
            "$.kind",
            f"this is a {excerpt(repr(found), 60)} document, but a {kind!r} was expected",
        )
    errors = sorted(_validator(kind).iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        where = excerpt(json_path(err.absolute_path), 80)
        raise InputError(source, where, f"{excerpt(err.message)}{more}")
    return doc


def load_document(path: str | Path, kind: str) -> dict[str, Any]:
    """Read, parse and validate a document file of ``kind``."""
    return validate(read_json(path), kind, str(path))
