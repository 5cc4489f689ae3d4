"""The OpenAPI document of the HTTP/JSON API, generated from the protobuf descriptors and the
route table, so that it describes exactly what the transport parses and returns: protobuf's JSON
mapping with the proto's field names (responses print every field without presence; unset
messages and optional fields are left out).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from scheduler import __version__
from scheduler.api import idempotency
from scheduler.api.errors import HTTP_STATUS
from scheduler.api.messages import MAX_PAGE, MAX_STRING_LENGTH, NOT_EMPTY_IN_UPDATE, TIME_RE
from scheduler.api.routes import ROUTES, Route
from scheduler.api.service import AUDIT_ENTITIES, METHODS
from scheduler.domain.run_state import RunState
from scheduler.domain.schedule import MisfirePolicy, OverlapPolicy, ScheduleState
from scheduler.schedule.service import MAX_BATCH
from scheduler.schedule.spec import (
    APP_NAME_RE,
    HANDLER_RE,
    MAX_CRON_LENGTH,
    MAX_DESCRIPTION_LENGTH,
    MAX_HANDLER_LENGTH,
    MAX_KEY_LENGTH,
    MAX_NAME_LENGTH,
    SCHEDULE_KEY_RE,
)

INT32 = {"type": "integer", "format": "int32", "minimum": -(2**31), "maximum": 2**31 - 1}
SCALARS: dict[int, dict[str, Any]] = {
    FieldDescriptor.TYPE_STRING: {"type": "string"},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
    FieldDescriptor.TYPE_INT32: INT32,
    FieldDescriptor.TYPE_DOUBLE: {"type": "number", "format": "double"},
}
WELL_KNOWN: dict[str, dict[str, Any]] = {
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.Value": {"description": "Any JSON value"},
}
APP_PATTERN = f"^{APP_NAME_RE.pattern}$"
# The form of a time the server reads (date-time alone allows a lower-case t and z, which it does not).
TIME_PATTERN = f"^{TIME_RE.pattern}$"
HANDLER_PATTERN = f"^(?:{HANDLER_RE.pattern})$"
UUID_PATTERN = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
# protobuf's pure-Python and upb descriptors declare no common type.
Descriptor = Any
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "details", "timestamp"],
            "properties": {
                "code": {"type": "string", "enum": sorted({code.value for code in HTTP_STATUS})},
                "message": {"type": "string"},
                "details": {"type": "object"},
                "timestamp": {"type": "string", "format": "date-time"},
            },
        }
    },
}
ERROR_DESCRIPTIONS = {
    400: "Malformed request",
    401: "No valid bearer token",
    403: "The token's roles do not allow this",
    404: "Not found (or another app's)",
    405: "The path does not take this method (see Allow)",
    409: "Conflict: a taken key, a changed version, a state that forbids it, a reused idempotency key",
    413: "Payload or request too large",
    415: "A body declared as other than JSON (a route that takes one)",
    422: "Not a schedule that can be stored",
    429: "Rate limited (see Retry-After)",
    500: "Internal error",
    503: "The database is unavailable",
}


# What a request's string fields may hold beyond their type, as the service checks it: by
# (message, field), then by field. A field without presence may also be empty: "not given".
REQUEST_CHOICES: dict[tuple[str, str] | str, tuple[str, ...]] = {
    ("ListSchedulesRequest", "state"): tuple(ScheduleState),
    ("ListRunsRequest", "state"): tuple(RunState),
    ("ListAuditEntriesRequest", "entity"): AUDIT_ENTITIES,
    "misfire_policy": tuple(MisfirePolicy),
    "overlap_policy": tuple(OverlapPolicy),
}


# The string fields the service bounds more tightly than any string of a request, so that a client
# that checks its requests against the document is not refused for a length the document allowed.
LENGTHS = {
    "name": MAX_NAME_LENGTH,
    "description": MAX_DESCRIPTION_LENGTH,
    "cron_expression": MAX_CRON_LENGTH,
    "handler": MAX_HANDLER_LENGTH,
    "schedule_key": MAX_KEY_LENGTH,
    "idempotency_key": idempotency.MAX_KEY_LENGTH,
}


# The keys' rules as patterns; an empty key is none (a schedule's id, no idempotency).
KEY_PATTERNS = {
    "schedule_key": f"^$|^(?:{SCHEDULE_KEY_RE.pattern})$",
    "idempotency_key": f"^$|^(?:{idempotency.KEY_RE.pattern})$",
}


# What a response's field holds beyond its type, where the proto's type says little.
AUDIT_VALUE = (
    "{}; left out where there is none (a create has no old value). About a schedule's create, "
    "update, pause, resume, cancel or error: the fields of a Schedule the change recorded, as "
    "GetSchedule answers them (schedule_key from the key's own row). Any other entry (an app's, "
    "a run's, a trigger's run_id): what was recorded."
)
FIELD_DESCRIPTIONS = {
    ("AuditEntry", "old_value"): AUDIT_VALUE.format("Before the change"),
    ("AuditEntry", "new_value"): AUDIT_VALUE.format("After the change"),
}


# The fields a create cannot leave out (nor give as null): every other request field may be left
# out, and an empty string is one left out.
NEEDED = {
    ("CreateScheduleRequest", "app"),
    ("CreateScheduleRequest", "handler"),
    ("CreateSchedulesRequest", "schedules"),
}
# The batch's schedules take no idempotency key of their own: the batch has one.
ITEM_EXCLUDED = {"CreateScheduleRequest": ("idempotency_key",)}


def _request_string(message: Descriptor, field: FieldDescriptor) -> dict[str, Any]:
    choices = REQUEST_CHOICES.get((message.name, field.name)) or REQUEST_CHOICES.get(field.name)
    if choices is not None:
        # None: an enum with nullable lists null among its values, or validators refuse it.
        return {"type": "string", "enum": [*([] if field.has_presence else [""]), *choices, None]}
    if (message.name, field.name) in NEEDED:
        if field.name == "app":
            return {"type": "string", "pattern": APP_PATTERN}
        return {"type": "string", "pattern": HANDLER_PATTERN, "maxLength": MAX_HANDLER_LENGTH}
    if field.name == "handler":  # an update's: given, it is a handler (an empty one is refused)
        return {"type": "string", "pattern": HANDLER_PATTERN, "maxLength": MAX_HANDLER_LENGTH}
    if field.name == "app":
        return {"type": "string", "pattern": f"^$|{APP_PATTERN}"}
    if field.name in ("id", "schedule_id", "run_id"):
        return {"type": "string", "pattern": f"^$|{UUID_PATTERN}"}
    schema: dict[str, Any] = {"type": "string", "maxLength": LENGTHS.get(field.name, MAX_STRING_LENGTH)}
    if field.name in KEY_PATTERNS:
        schema["pattern"] = KEY_PATTERNS[field.name]
    if message.name == "UpdateScheduleRequest" and field.name in NOT_EMPTY_IN_UPDATE:
        schema["minLength"] = 1
    return schema


def _field_schema(field: FieldDescriptor, components: dict[str, Any], response: bool) -> dict[str, Any]:
    if field.message_type is not None:
        name = field.message_type.full_name
        if name in WELL_KNOWN:
            schema = dict(WELL_KNOWN[name])
            if name == "google.protobuf.Timestamp" and not response:
                schema["pattern"] = TIME_PATTERN
        else:
            schema = {"$ref": f"#/components/schemas/{_component(field.message_type, components, response)}"}
    elif field.type == FieldDescriptor.TYPE_STRING and not response:
        schema = _request_string(field.containing_type, field)
    else:
        schema = dict(SCALARS[field.type])
    if not field.is_repeated:
        return schema
    array: dict[str, Any] = {"type": "array", "items": schema}
    if not response and field.full_name == "scheduler.v1.CreateSchedulesRequest.schedules":
        array |= {"minItems": 1, "maxItems": MAX_BATCH}
    return array


def _suffix(response: bool) -> str:
    return "" if response else "Input"


def _component(message: Descriptor, components: dict[str, Any], response: bool) -> str:
    name = f"{message.name}{_suffix(response)}"
    if name not in components:
        components[name] = {}  # placeholder: recursion stops here
        excluded = () if response else ITEM_EXCLUDED.get(message.name, ())
        components[name] = message_schema(message, components, response, excluded)
    return name


def message_schema(
    message: Descriptor, components: dict[str, Any], response: bool, exclude: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A message's JSON form. In a response every field without presence is printed (so required);
    a request may leave out any field and may hold no other."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in message.fields:
        if field.name in exclude:
            continue
        properties[field.name] = _field_schema(field, components, response)
        description = FIELD_DESCRIPTIONS.get((message.name, field.name)) if response else None
        if description is not None:
            properties[field.name] = properties[field.name] | {"description": description}
        if not response and "$ref" not in properties[field.name] and (message.name, field.name) not in NEEDED:
            # protobuf's JSON mapping reads a null as the field left out.
            properties[field.name] = properties[field.name] | {"nullable": True}
        has_presence = field.message_type is not None or field.has_presence
        if response and (field.is_repeated or not has_presence):
            required.append(field.name)
        if not response and (message.name, field.name) in NEEDED:
            required.append(field.name)
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def _parameter(route: Route, message: Descriptor, name: str, where: str, components: dict[str, Any]) -> Any:
    field = message.fields_by_name[name]
    schema = _field_schema(field, components, response=False)
    if name == "limit":
        schema = schema | {"minimum": 1, "maximum": MAX_PAGE}
    if where == "path" and name == "id":
        schema = {"type": "string", "format": "uuid"}
    # A query string's length is bounded by the server's request line (16 KiB) before any field's:
    # the 4,096 characters a field takes is the body's bound.
    schema.pop("maxLength", None)
    if "enum" in schema:  # a query parameter is text, never null
        schema["enum"] = [value for value in schema["enum"] if value is not None]
    return {"name": name, "in": where, "required": where == "path", "schema": schema}


def _operation(route: Route, components: dict[str, Any]) -> dict[str, Any]:
    method = METHODS[route.method]
    request = method.request.DESCRIPTOR
    parameters = [_parameter(route, request, name, "path", components) for name in route.path_fields]
    parameters += [_parameter(route, request, name, "query", components) for name in route.query]
    if method.idempotent:
        parameters.append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "schema": {
                    "type": "string",
                    "maxLength": idempotency.MAX_KEY_LENGTH,
                    "pattern": KEY_PATTERNS["idempotency_key"],
                },
                "description": "The same key with the same request returns the first response for 24 h "
                f"(an empty key is none): {idempotency.KEY_RULE}",
            }
        )
    response = _component(method.response.DESCRIPTOR, components, True)
    operation: dict[str, Any] = {
        "operationId": route.method,
        "summary": route.summary,
        "tags": [route.path.split("/")[2].split(":")[0]],
        "parameters": parameters,
        "responses": {
            "200": {
                "description": "OK",
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{response}"}}},
            },
            **{
                str(status): {  # every error the API may answer, in the one error body
                    "description": text,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                }
                for status, text in ERROR_DESCRIPTIONS.items()
                if status != 415 or route.body
            },
        },
    }
    if route.body:
        body = message_schema(request, components, response=False, exclude=route.path_fields + route.query)
        name = f"{route.method}Body"
        components[name] = body
        operation["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        }
    return operation


def document() -> dict[str, Any]:
    components: dict[str, Any] = {"Error": ERROR}
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.verb.lower()] = _operation(route, components)
    paths["/v1/health"] = {
        "get": {
            "operationId": "Health",
            "summary": "Whether this replica serves: its database answers",
            "tags": ["health"],
            "security": [],
            "responses": {
                "200": {"description": "Serving", "content": {"application/json": {"schema": HEALTH}}},
                "503": {"description": "Not serving", "content": {"application/json": {"schema": HEALTH}}},
            },
        }
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "scheduler.v1.SchedulerService",
            "version": __version__,
            "description": "The scheduler's API over HTTP/JSON; the same service is served over gRPC. "
            "Every call but /v1/health needs a bearer token (JWT).",
        },
        "paths": paths,
        "components": {
            "schemas": dict(sorted(components.items())),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        },
        "security": [{"bearer": []}],
    }


HEALTH = {
    "type": "object",
    "required": ["status"],
    "properties": {"status": {"type": "string", "enum": ["SERVING", "NOT_SERVING"]}},
}
