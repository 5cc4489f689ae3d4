"""Strict, offline validation of custom resources against the operators' own CRD schemas.

``kubernetes-validate`` knows the core kinds only, so the custom resources in ``k8s/`` are checked here
against the ``openAPIV3Schema`` of the CRD releases vendored in ``crds/`` (see ``crds/README.md``).
The OpenAPI v3 structural schema is turned into JSON Schema the way the API server reads it with
strict field validation: a field the schema does not declare is an error, not silently pruned.

Not checked: ``x-kubernetes-validations`` (CEL rules), ``format``, and list-type uniqueness.
"""

from __future__ import annotations

import difflib
import json
import re
import reprlib
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

CRD_DIR = Path(__file__).resolve().parent / "crds"

_STRING_MAP: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}

# The API server decodes every resource's metadata as ObjectMeta whatever the CRD declares (CRDs
# usually say only ``metadata: {type: object}``), so it is checked against ObjectMeta's fields.
OBJECT_META: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["apiVersion", "kind", "name", "uid"],
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "name": {"type": "string"},
                    "uid": {"type": "string"},
                    "controller": {"type": "boolean"},
                    "blockOwnerDeletion": {"type": "boolean"},
                },
            },
        },
        "uid": {"type": "string"},
        "resourceVersion": {"type": "string"},
        "generation": {"type": "integer"},
        "selfLink": {"type": "string"},
        "creationTimestamp": {"type": ["string", "null"]},
        "deletionTimestamp": {"type": ["string", "null"]},
        "deletionGracePeriodSeconds": {"type": "integer"},
        "managedFields": {"type": "array", "items": {"type": "object"}},
    },
}

# OpenAPI keywords that mean the same in JSON Schema 2020-12; everything else (description, format,
# default, example, nullable, x-kubernetes-*) is annotation or is translated below.
_SAME_KEYWORDS = frozenset(
    {
        "enum",
        "required",
        "minimum",
        "maximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minProperties",
        "maxProperties",
    }
)
_INT_OR_STRING_BRANCHES = [{"type": "integer"}, {"type": "string"}]


def _convert(schema: Mapping[str, Any], *, in_junctor: bool = False) -> dict[str, Any]:
    """One OpenAPI v3 structural schema node as JSON Schema.

    Inside ``allOf``/``anyOf``/``oneOf``/``not`` a structural schema only restates constraints on
    fields its parent declares, so there an object does not close itself to other fields.
    """
    out: dict[str, Any] = {key: value for key, value in schema.items() if key in _SAME_KEYWORDS}
    if "pattern" in out:
        out["pattern"] = _python_pattern(out["pattern"])
    for key in ("properties", "patternProperties"):
        if key in schema:
            out[key] = {name: _convert(sub, in_junctor=in_junctor) for name, sub in schema[key].items()}
    if isinstance(schema.get("items"), Mapping):
        out["items"] = _convert(schema["items"], in_junctor=in_junctor)
    additional = schema.get("additionalProperties")
    if isinstance(additional, Mapping):
        out["additionalProperties"] = _convert(additional, in_junctor=in_junctor)
    elif isinstance(additional, bool):
        out["additionalProperties"] = additional
    if "not" in schema:
        out["not"] = _convert(schema["not"], in_junctor=True)

    int_or_string = schema.get("x-kubernetes-int-or-string") is True
    for key in ("allOf", "anyOf", "oneOf"):
        branches = schema.get(key)
        # The anyOf that accompanies int-or-string only restates the type set just below.
        if branches and not (int_or_string and key == "anyOf" and branches == _INT_OR_STRING_BRANCHES):
            out[key] = [_convert(sub, in_junctor=True) for sub in branches]

    types = ["integer", "string"] if int_or_string else [schema["type"]] if "type" in schema else []
    nullable = schema.get("nullable") is True
    if types:
        if nullable:
            types.append("null")
        out["type"] = types[0] if len(types) == 1 else types
    if nullable and "enum" in out and None not in out["enum"]:
        out["enum"] = [*out["enum"], None]

    # OpenAPI 3.0 spells exclusive bounds as booleans beside minimum/maximum.
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if schema.get(exclusive) is True and bound in out:
            out[exclusive] = out.pop(bound)

    is_object = schema.get("type") == "object" or "properties" in schema
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
    if is_object and not in_junctor:
        if schema.get("x-kubernetes-embedded-resource") is True:
            properties = out.setdefault("properties", {})
            properties.setdefault("apiVersion", {"type": "string"})
            properties.setdefault("kind", {"type": "string"})
            properties["metadata"] = _metadata_schema(schema.get("properties", {}).get("metadata", {}))
        # An object with neither properties nor additionalProperties closes too: the API server
        # prunes every field of it (so strict validation reports each), unless told to preserve them.
        if not preserve and "additionalProperties" not in out:
            out["additionalProperties"] = False
    return out


def _python_pattern(pattern: str) -> str:
    """A Go (RE2) pattern as Python reads it.

    RE2 takes ``(?i)`` anywhere (prometheus-operator writes ``^(?i)(abort|warn)?$``); Python only at
    the very start, so a flag group right after ``^`` becomes a scoped ``(?i:...)``.
    """
    match = re.fullmatch(r"\^\(\?([ims]+)\)(.*)", pattern, re.DOTALL)
    return f"^(?{match[1]}:{match[2]})" if match else pattern


def _metadata_schema(declared: Mapping[str, Any]) -> dict[str, Any]:
    """ObjectMeta, narrowed by whatever the CRD itself says of metadata (e.g. a name pattern)."""
    narrowing = _convert(declared, in_junctor=True)
    narrowing.pop("type", None)
    return {"allOf": [OBJECT_META, narrowing]} if narrowing else OBJECT_META


def to_json_schema(open_api_schema: Mapping[str, Any]) -> dict[str, Any]:
    """A CRD version's ``openAPIV3Schema`` as a JSON Schema (2020-12) for a whole resource."""
    schema = _convert(open_api_schema)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    properties = schema.setdefault("properties", {})
    properties.setdefault("apiVersion", {"type": "string"})
    properties.setdefault("kind", {"type": "string"})
    properties["metadata"] = _metadata_schema(open_api_schema.get("properties", {}).get("metadata", {}))
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    return schema


@cache
def _schema_files() -> dict[tuple[str, str], Path]:
    files: dict[tuple[str, str], Path] = {}
    for path in sorted(CRD_DIR.glob("*.json")):
        group, version, kind = path.stem.split("_")
        files[(f"{group}/{version}", kind)] = path
    return files


def known_kinds() -> set[tuple[str, str]]:
    """Every (apiVersion, kind) with a vendored schema."""
    return set(_schema_files())


def load_open_api_schema(api_version: str, kind: str) -> dict[str, Any]:
    path = _schema_files()[(api_version, kind)]
    schema: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return schema


@cache
def _validator(api_version: str, kind: str) -> Any:
    schema = to_json_schema(load_open_api_schema(api_version, kind))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def validate_custom_resource(obj: Mapping[str, Any]) -> list[str]:
    """Every way ``obj`` breaks its kind's CRD schema, as ``path: message`` lines; empty when valid."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return [f"(root): apiVersion and kind must be strings, got {api_version!r} and {kind!r}"]
    if (api_version, kind) not in _schema_files():
        return [f"(root): no CRD schema is vendored for apiVersion {api_version!r} kind {kind!r}"]
    errors = _validator(api_version, kind).iter_errors(obj)
    return sorted({line for error in errors for line in _describe(error)})


_brief = reprlib.Repr()
_brief.maxstring = 60
_brief.maxother = 60


def _join(path: Iterable[str | int]) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part.replace("_", "").replace("-", "").isalnum():
            text += f".{part}" if text else part
        else:
            text += f"[{part!r}]"
    return text or "(root)"


def _describe(error: Any) -> Iterator[str]:
    path = list(error.absolute_path)
    where = _join(path)
    if error.validator == "additionalProperties" and error.validator_value is False:
        declared = sorted(error.schema.get("properties", {}))
        for name in sorted(set(error.instance) - set(declared)):
            near = difflib.get_close_matches(name, declared, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            yield f"{_join([*path, name])}: unknown field{hint}"
    elif error.validator == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        yield f"{where}: expected {expected}, got {_brief.repr(error.instance)}"
    elif error.validator in ("oneOf", "anyOf"):
        if error.context:
            reasons = "; ".join(sorted({_context_line(e) for e in error.context}))
            yield f"{where}: matches none of the {error.validator} alternatives ({reasons})"
        else:
            yield f"{where}: matches more than one of the oneOf alternatives"
    elif error.validator == "enum":
        yield f"{where}: {_brief.repr(error.instance)} is not one of {error.validator_value!r}"
    else:
        yield f"{where}: {error.message}"


def _context_line(error: Any) -> str:
    return f"{_join(error.relative_path)}: {error.message}" if error.relative_path else str(error.message)
