"""The API's pure parts: its settings, the token checks, the JSON mapping of payloads and cursors,
and the OpenAPI document's shape. Through the transports: tests/api/."""

from __future__ import annotations

import time

import jwt
import pytest

from scheduler.api.auth import Authenticator, Principal, Role
from scheduler.api.errors import ApiError, Code
from scheduler.api.messages import as_dict, decode_cursor, encode_cursor, json_value, payload_of
from scheduler.api.openapi import document
from scheduler.api.routes import ROUTES
from scheduler.config import ConfigError, JwtSettings, load_settings
from scheduler.v1 import scheduler_pb2 as pb

SECRET = "unit-tests-secret-of-32-bytes-or-more"


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"SCHEDULER_JWT_SECRET": "short"}, "at least 32 bytes"),
        ({"SCHEDULER_JWT_SECRET": SECRET, "SCHEDULER_JWT_JWKS": "/etc/hostname"}, "not both"),
        ({"SCHEDULER_JWT_SECRET": SECRET, "SCHEDULER_JWT_ALGORITHMS": "none"}, "'none' cannot be used"),
        ({"SCHEDULER_JWT_SECRET": SECRET, "SCHEDULER_JWT_ALGORITHMS": "RS256"}, "'RS256' cannot be used"),
        (
            {"SCHEDULER_JWT_JWKS": "/etc/hostname", "SCHEDULER_JWT_ALGORITHMS": "HS256"},
            "'HS256' cannot be used",
        ),
        ({"SCHEDULER_JWT_JWKS": "/no/such/jwks.json"}, "neither an http(s) URL nor a readable file"),
        # Whoever answers a plain-HTTP fetch supplies the keys: refused, the URL's credentials unshown.
        (
            {"SCHEDULER_JWT_JWKS": f"http://u:{SECRET}@idp.example/jwks?s={SECRET}"},
            "http://idp.example is plain",
        ),
        ({"SCHEDULER_JWT_JWKS": "http://10.0.0.5:8080/certs"}, "use https://"),
        ({"SCHEDULER_API_RATE_LIMITS": "trigger=five/min"}, "SCHEDULER_API_RATE_LIMITS"),
        ({"SCHEDULER_API_RATE_LIMITS": "nope=1/min"}, "SCHEDULER_API_RATE_LIMITS"),
        ({"SCHEDULER_API_PORT": "70000"}, "SCHEDULER_API_PORT"),
    ],
)
def test_bad_api_settings_are_one_line_naming_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(env)
    assert names in str(raised.value) and "\n" not in str(raised.value)
    assert SECRET not in str(raised.value)


@pytest.mark.parametrize(
    "url", ["https://idp.example/jwks", "http://127.0.0.1:8080/jwks", "http://localhost/k"]
)
def test_a_jwks_url_over_https_or_from_this_host_is_taken(url: str) -> None:
    assert load_settings({"SCHEDULER_JWT_JWKS": url}).jwt.jwks == url


def test_the_secret_never_shows_in_the_settings_repr_and_limits_override_their_class() -> None:
    settings = load_settings({"SCHEDULER_JWT_SECRET": SECRET, "SCHEDULER_API_RATE_LIMITS": "trigger=5/s"})
    assert SECRET not in repr(settings)
    assert settings.jwt.algorithms == ("HS256",)
    assert dict((name, (count, period)) for name, count, period in settings.rate_limits)["trigger"] == (
        5,
        1.0,
    )


def _token(secret: str = SECRET, **claims: object) -> str:
    now = int(time.time())
    return jwt.encode({"sub": "alice", "exp": now + 60, "roles": ["SCHEDULER_USER"]} | claims, secret)


def test_a_token_gives_its_subject_roles_and_apps_and_an_admin_without_apps_sees_all() -> None:
    auth = Authenticator(JwtSettings(secret=SECRET, algorithms=("HS256",)))
    user = auth.authenticate(f"Bearer {_token(apps='alpha beta')}")
    assert (user.subject, user.roles, user.apps) == (
        "alice",
        frozenset({Role.USER}),
        frozenset({"alpha", "beta"}),
    )
    admin = auth.authenticate(f"Bearer {_token(roles=['SCHEDULER_ADMIN', 'other'])}")
    assert admin.apps is None and admin.roles == {Role.ADMIN}
    assert auth.authenticate(f"Bearer {_token()}").apps == frozenset()


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Basic abc",
        "Bearer not.a.token",
        f"Bearer {_token(exp=int(time.time()) - 120)}",
        f"Bearer {_token(nbf=int(time.time()) + 120)}",
        f"Bearer {_token(secret='another-secret-of-32-bytes-or-more')}",
        "Bearer eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhbGljZSIsImV4cCI6OTk5OTk5OTk5OX0.",
    ],
)
def test_a_token_that_does_not_verify_is_unauthenticated(authorization: str | None) -> None:
    auth = Authenticator(JwtSettings(secret=SECRET, algorithms=("HS256",), leeway_s=30))
    with pytest.raises(ApiError) as raised:
        auth.authenticate(authorization)
    assert raised.value.code == Code.UNAUTHENTICATED
    assert SECRET not in raised.value.message


def test_whole_numbers_of_a_payload_come_back_as_integers() -> None:
    request = pb.CreateScheduleRequest(payload=json_value({"n": 1, "f": 1.5, "list": [2, {"deep": 3}]}))
    assert payload_of(request) == {"n": 1, "f": 1.5, "list": [2, {"deep": 3}]}
    schedule = pb.Schedule(payload=json_value({"n": 1}), retry_config=pb.RetryConfig(max_attempts=3))
    assert as_dict(schedule)["payload"] == {"n": 1}


def test_a_payload_over_a_mebibyte_is_too_large() -> None:
    request = pb.CreateScheduleRequest(payload=json_value({"blob": "x" * (1024 * 1024)}))
    with pytest.raises(ApiError) as raised:
        payload_of(request)
    assert raised.value.code == Code.PAYLOAD_TOO_LARGE and raised.value.http_status == 413


def test_a_cursor_round_trips_and_a_forged_one_is_a_bad_request() -> None:
    assert decode_cursor(encode_cursor("2026-01-01T00:00:00+00:00", "x"), 2) == [
        "2026-01-01T00:00:00+00:00",
        "x",
    ]
    for forged in ("!!!", encode_cursor("only-one"), "eyJ9"):
        with pytest.raises(ApiError) as raised:
            decode_cursor(forged, 2)
        assert raised.value.code == Code.INVALID_ARGUMENT


def test_the_openapi_document_has_every_route_with_its_error_answers() -> None:
    spec = document()
    for route in ROUTES:
        operation = spec["paths"][route.path][route.verb.lower()]
        assert operation["operationId"] == route.method
        assert {"200", "400", "401", "403", "404", "409", "413", "422", "429", "500"} <= set(
            operation["responses"]
        )
    schedule = spec["components"]["schemas"]["Schedule"]
    assert "run_at" not in schedule["required"] and "state" in schedule["required"]


def test_the_openapi_document_bounds_each_string_as_the_server_does() -> None:
    """A client that checks its requests against the document is not refused for a length it allowed."""
    schemas = document()["components"]["schemas"]
    for body in ("CreateScheduleBody", "UpdateScheduleBody"):
        fields = schemas[body]["properties"]
        bounds = {
            name: fields[name].get("maxLength")
            for name in ("name", "description", "cron_expression", "handler")
        }
        assert bounds == {"name": 200, "description": 2000, "cron_expression": 200, "handler": 300}, body
        assert "pattern" in fields["handler"], body
    assert schemas["CreateScheduleBody"]["properties"]["schedule_key"]["maxLength"] == 200


def test_a_principal_is_its_issuer_and_subject_apart_however_they_are_spelled() -> None:
    def key(issuer: str | None, subject: str) -> str:
        return Principal(subject=subject, issuer=issuer, roles=frozenset(), apps=None).key

    assert key("a", "b|c") != key("a|b", "c")
    assert key("a\\", "b") != key("a", "\\|b")
    assert key("a", "") != key("", "a")  # (an empty "iss" is refused: it would be no issuer's)
    # A principal without "|" or "\" keeps the key it had, which stored records and buckets hold.
    assert key("https://idp.example/realms/x", "alice") == "https://idp.example/realms/x|alice"
    assert key(None, "system:serviceaccount:jobs:runner") == "|system:serviceaccount:jobs:runner"
