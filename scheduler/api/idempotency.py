"""Idempotency keys: the same key with the same request returns the first response for 24 hours.

The key is claimed in the transaction that does the work (:func:`scheduler.store.api.claim_idempotency_key`),
so of concurrent duplicates one does the work while the others wait on its row and then return its
response; the same key with another request is refused. A request that fails leaves no key behind
(its transaction rolled back), so it may be retried with the same key.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
from google.protobuf import json_format
from google.protobuf.message import Message

from scheduler.api.errors import ApiError, Code
from scheduler.api.messages import as_dict
from scheduler.store import api as store

Row = dict[str, Any]
M = TypeVar("M", bound=Message)
TTL_S = 24 * 3600.0
MAX_KEY_LENGTH = 200
# Printable ASCII, a space only between other characters: what an HTTP header carries as it was
# sent (a header's blanks at either end are dropped on the way, and other bytes are read as
# Latin-1), so that a key reads the same in the Idempotency-Key header, a body and a gRPC message.
KEY_RE = re.compile(r"[!-~](?:[ -~]*[!-~])?")
KEY_RULE = (
    f"1 to {MAX_KEY_LENGTH} printable ASCII characters, with spaces only between them "
    "(no tab, line break, control or non-ASCII character)"
)


def check_key(key: str) -> None:
    """Refuse an idempotency key that is not :data:`KEY_RULE` (an empty one is none)."""
    if len(key) > MAX_KEY_LENGTH or not KEY_RE.fullmatch(key):
        raise ApiError(
            Code.INVALID_ARGUMENT,
            f"idempotency_key (or the Idempotency-Key header) must be {KEY_RULE}",
            {"field": "idempotency_key"},
        )


def request_hash(method: str, request: Message, scope: Sequence[str] | None = None) -> str:
    """What identifies a request: its method and fields (the key itself left out), and the apps the
    caller may see, so that a token of the same subject with a narrower scope never gets a first
    response about an app it cannot see (its request counts as another one)."""
    copy = type(request)()
    copy.CopyFrom(request)
    copy.ClearField("idempotency_key")
    seen = "*" if scope is None else ",".join(sorted(scope))
    material = b"\0".join((method.encode(), seen.encode(), copy.SerializeToString(deterministic=True)))
    return hashlib.sha256(material).hexdigest()


def once(
    conn: psycopg.Connection[Row],
    principal: str,
    method: str,
    request: Message,
    response_type: type[M],
    work: Callable[[], M],
    scope: Sequence[str] | None = None,
) -> M:
    """``work()`` in one transaction with the claim of the request's key, or the first response."""
    # Every idempotent method's request has the field; Message itself does not declare it.
    key: str = getattr(request, "idempotency_key")  # noqa: B009
    if not key:
        return work()
    check_key(key)
    digest = request_hash(method, request, scope)
    with conn.transaction():
        if store.claim_idempotency_key(conn, principal, method, key, digest, TTL_S):
            response = work()
            store.record_response(conn, principal, method, key, as_dict(response))
            return response
        first = store.first_response(conn, principal, method, key)
    if first is None or first["response"] is None:
        # Claimed and committed without a response cannot happen (both are in one transaction);
        # a row swept between the two statements can: the client retries and gets a fresh claim.
        raise ApiError(Code.FAILED_PRECONDITION, "the idempotency key's first request is unfinished; retry")
    if first["request_hash"] != digest:
        raise ApiError(
            Code.IDEMPOTENCY_KEY_REUSED,
            "this idempotency key was used with another request; use a new key for a new request",
            {"field": "idempotency_key"},
        )
    return json_format.ParseDict(first["response"], response_type())
