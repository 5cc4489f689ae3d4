"""Who may call the API: bearer tokens on both transports, the keys that verify them, and the roles.

The refusals a client can meet are checked on HTTP/JSON (401, code UNAUTHENTICATED, a
``WWW-Authenticate`` challenge) and on gRPC (status UNAUTHENTICATED): missing, malformed and forged
tokens, the time claims around the leeway, issuer and audience, and key pairs from a JWKS file or
URL, rotation included. Then what each role may do, and that no secret or token text ever reaches
the API's log or its answers.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from google.protobuf import json_format
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from bench.chaos_stack import free_port
from scheduler.api.service import METHODS
from tests.api.client import ADMIN, SECRET, USER, VIEWER, GrpcCaller, HttpCaller, Outcome, grpc_error, token
from tests.api.conftest import ApiProcess, ApiStack, _serving
from tests.support import SCHEDULER, wait_for

pytestmark = pytest.mark.e2e

Caller = HttpCaller | GrpcCaller
LEEWAY_S = 30  # the default SCHEDULER_JWT_LEEWAY_S
ISSUER = "https://idp.example/realms/ops"
AUDIENCE = "scheduler-api"
ROTATED_KID = "url-rsa-2"
READ_CALL: tuple[str, dict[str, Any]] = ("ListSchedules", {})


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_made(header: dict[str, Any], claims: dict[str, Any], sign: Callable[[bytes], bytes]) -> str:
    """A JWT assembled without PyJWT, which refuses to make the forgeries these tests send."""
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    return f"{signing_input}.{b64url(sign(signing_input.encode()))}"


def claims(**extra: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"sub": "mallory", "iat": now, "exp": now + 600, "roles": [ADMIN]} | extra


def call_raw(caller: Caller, method: str, request: dict[str, Any], authorization: str | None) -> Outcome:
    """A call whose ``Authorization`` value is given whole (the callers only send ``Bearer <token>``)."""
    if isinstance(caller, HttpCaller):
        headers = {} if authorization is None else {"Authorization": authorization}
        return caller.call(method, request, None, headers=headers)
    message = json_format.ParseDict(request, METHODS[method].request())
    metadata = [] if authorization is None else [("authorization", authorization)]
    try:
        getattr(caller.stub, method)(message, metadata=metadata, timeout=30)
    except grpc.RpcError as error:
        return grpc_error(error)
    return Outcome("OK", grpc_status=grpc.StatusCode.OK)


def assert_unauthenticated(outcome: Outcome, sent: str | None = None) -> None:
    assert outcome.code == "UNAUTHENTICATED", outcome
    message = str(outcome.body.get("message", ""))
    assert message and "\n" not in message
    assert SECRET not in message
    for part in (sent or "").replace(".", " ").split():
        assert len(part) < 16 or part not in message, "the answer repeats what was sent"
    if outcome.grpc_status is None:
        assert outcome.http_status == 401
        challenge = {k.lower(): v for k, v in outcome.headers.items()}.get("www-authenticate", "")
        assert challenge.startswith("Bearer"), outcome.headers
    else:
        assert outcome.grpc_status == grpc.StatusCode.UNAUTHENTICATED


@pytest.fixture(scope="module")
def sent() -> list[str]:
    """Every token and secret sent to an API in this module, for the log check at its end."""
    return []


def refused(caller: Caller, bearer: str, sent: list[str]) -> None:
    sent.append(bearer)
    assert_unauthenticated(caller.call(*READ_CALL, bearer), bearer)


def accepted(caller: Caller, bearer: str, sent: list[str]) -> Outcome:
    sent.append(bearer)
    outcome = caller.call(*READ_CALL, bearer)
    assert outcome.ok, outcome
    return outcome


# --- the HMAC secret of the module's API -----------------------------------------------------------


def _none_alg() -> str:
    return hand_made({"alg": "none", "typ": "JWT"}, claims(), lambda _: b"")


def _signed_by_hand(**extra: Any) -> str:
    """A token signed with the API's key whose claims PyJWT would refuse to encode."""
    return hand_made(
        {"alg": "HS256", "typ": "JWT"},
        claims(**extra),
        lambda signing_input: hmac.new(SECRET.encode(), signing_input, hashlib.sha256).digest(),
    )


def _without(name: str) -> str:
    body = claims()
    del body[name]
    return jwt.encode(body, SECRET, algorithm="HS256")


REFUSED_TOKENS: dict[str, Callable[[], str]] = {
    "garbage": lambda: "not-a-token",
    "three-garbage-parts": lambda: "a.b.c",
    "alg-none": _none_alg,
    "alg-none-capitalised": lambda: hand_made({"alg": "None", "typ": "JWT"}, claims(), lambda _: b""),
    "expired": lambda: token(ttl_s=-(LEEWAY_S + 60)),
    "not-yet-valid": lambda: token(nbf=int(time.time()) + LEEWAY_S + 60),
    "no-sub": lambda: _without("sub"),
    "empty-sub": lambda: token(subject=""),
    "no-exp": lambda: _without("exp"),
    "other-secret": lambda: token(secret="another-secret-that-is-also-32-bytes-long"),
    "tampered-claims": lambda: _tampered(),
    "exp-as-a-string": lambda: token(exp=str(int(time.time()) + 600)),
    "iat-as-a-string": lambda: token(iat=str(int(time.time()))),
    # PyJWT reads true as 1, a time long past: refused for its type all the same, not as "expired".
    "exp-true": lambda: _signed_by_hand(exp=True),
    "sub-over-512-bytes": lambda: token(subject="é" * 257),
    "iss-over-512-bytes": lambda: token(iss="https://" + "i" * 510),
    # Read as no issuer, it would share the buckets and keys of the subject's tokens without one.
    "iss-a-number": lambda: _signed_by_hand(iss=5),
    "iss-null": lambda: _signed_by_hand(iss=None),
    "iss-empty": lambda: token(iss=""),
    "sub-with-nul": lambda: token(subject="mallory\x00admin"),
    "iss-with-nul": lambda: token(iss="https://idp\x00"),
}


def _tampered() -> str:
    """A viewer's real token with its payload swapped for an admin's: the signature no longer fits."""
    header, _, signature = token(roles=(VIEWER,)).split(".")
    return f"{header}.{b64url(json.dumps(claims()).encode())}.{signature}"


def test_subjects_alike_in_their_first_hundreds_of_characters_are_two_principals(
    caller: Caller, sent: list[str]
) -> None:
    """A subject is counted whole (it was once cut at 200 characters, and two such callers shared
    idempotency keys, rate buckets and audit actor); a Kubernetes service account's is accepted."""
    request = {"app": "alpha", "name": f"twin-{uuid.uuid4().hex[:8]}", "handler": "builtin:noop"}
    key = {"Idempotency-Key": f"twin-{uuid.uuid4().hex}"}
    prefix = "system:serviceaccount:" + "n" * 63 + ":" + "s" * 240
    alice, mallory = token(subject=prefix + "-alice"), token(subject=prefix + "-mallory")
    sent += [alice, mallory]
    first = caller.call("CreateSchedule", {**request, "idempotency_key": key["Idempotency-Key"]}, alice)
    second = caller.call("CreateSchedule", {**request, "idempotency_key": key["Idempotency-Key"]}, mallory)
    assert first.ok and second.ok, (first, second)
    assert first.body["id"] != second.body["id"]
    audit = caller.call("ListAuditEntries", {"entity_id": second.body["id"]}, mallory)
    assert [entry["actor"] for entry in audit.body["entries"]] == [f"api:{prefix}-mallory"], audit


def test_an_issuer_and_subject_that_join_alike_are_two_principals(caller: Caller, sent: list[str]) -> None:
    """Issuer "a" with subject "b|c" and issuer "a|b" with subject "c" once made one key "a|b|c",
    and shared idempotency keys and rate buckets."""
    request = {"app": "alpha", "name": f"join-{uuid.uuid4().hex[:8]}", "handler": "builtin:noop"}
    key = f"join-{uuid.uuid4().hex}"
    first_caller, second_caller = token(iss="a", subject="b|c"), token(iss="a|b", subject="c")
    sent += [first_caller, second_caller]
    first = caller.call("CreateSchedule", {**request, "idempotency_key": key}, first_caller)
    second = caller.call("CreateSchedule", {**request, "idempotency_key": key}, second_caller)
    assert first.ok and second.ok, (first, second)
    assert first.body["id"] != second.body["id"]


def test_no_token_is_refused(extra_apis: dict[str, Api], caller: Caller) -> None:
    # By every configuration here; being first, this also starts them all early (see extra_apis).
    for one in [caller, *(other.same_transport(caller) for other in extra_apis.values())]:
        assert_unauthenticated(call_raw(one, *READ_CALL, None))
        assert_unauthenticated(call_raw(one, "GetSchedule", {"id": str(uuid.uuid4())}, None))


@pytest.mark.parametrize(
    "authorization",
    ["Basic YWxpY2U6c2VjcmV0", f"Token {token()}", "Bearer", token()],
    ids=["basic", "other-scheme", "bearer-alone", "token-without-scheme"],
)
def test_only_the_bearer_scheme_is_accepted(caller: Caller, authorization: str, sent: list[str]) -> None:
    sent.extend(part for part in authorization.split() if len(part) >= 16)
    assert_unauthenticated(call_raw(caller, *READ_CALL, authorization), authorization)


@pytest.mark.parametrize("case", list(REFUSED_TOKENS))
def test_invalid_tokens_are_refused(caller: Caller, case: str, sent: list[str]) -> None:
    bearer = REFUSED_TOKENS[case]()
    refused(caller, bearer, sent)
    assert_unauthenticated(caller.call("GetSchedule", {"id": str(uuid.uuid4())}, bearer), bearer)


def test_a_time_claim_of_the_wrong_type_is_refused_for_its_type_even_when_it_reads_as_long_past(
    caller: Caller, sent: list[str]
) -> None:
    for name in ("exp", "nbf"):
        # An expiry of true reads as long past, and a start of true as long begun (not a refusal).
        bearer = _signed_by_hand(**{name: True})
        sent.append(bearer)
        outcome = caller.call(*READ_CALL, bearer)
        assert_unauthenticated(outcome, bearer)
        assert f"the token's {name!r} claim must be a number" in outcome.body["message"], outcome


def test_an_apps_claim_holding_anything_but_names_grants_no_app(caller: Caller, sent: list[str]) -> None:
    """ "Not a list of names sees none": not the names it happens to hold besides."""
    for apps in (["alpha", 5], ["alpha", None], ["alpha", ["beta"]]):
        bearer = token(subject="odd-apps", roles=(VIEWER,), apps=apps)  # type: ignore[arg-type]
        sent.append(bearer)
        assert caller.call("ListRuns", {"app": "alpha"}, bearer).code == "NOT_FOUND", apps
    named = token(subject="odd-apps", roles=(VIEWER,), apps=["alpha"])
    sent.append(named)
    assert caller.call("ListRuns", {"app": "alpha"}, named).ok


def test_the_leeway_forgives_a_little_clock_skew(caller: Caller, sent: list[str]) -> None:
    accepted(caller, token(ttl_s=-5), sent)
    accepted(caller, token(nbf=int(time.time()) + 5), sent)
    # Far beyond the leeway either way is another matter (the refusals above).
    refused(caller, token(ttl_s=-(LEEWAY_S + 5)), sent)


def test_the_scheme_name_is_not_case_sensitive(caller: Caller, sent: list[str]) -> None:
    bearer = token()
    sent.append(bearer)
    assert call_raw(caller, *READ_CALL, f"bearer {bearer}").ok


# --- issuer, audience and a nested roles claim, as an identity provider issues them --------------


@dataclass
class Api:
    process: ApiProcess
    http: HttpCaller
    grpc: GrpcCaller

    def same_transport(self, caller: Caller) -> Caller:
        return self.http if isinstance(caller, HttpCaller) else self.grpc


@dataclass
class KeyPairs:
    rsa_key: rsa.RSAPrivateKey
    ec_key: ec.EllipticCurvePrivateKey
    rotated_key: rsa.RSAPrivateKey
    served: list[dict[str, Any]]
    """The JWKS the URL serves now."""
    fetches: list[float]
    rotated_after: int | None = None
    """How many times the API had fetched the JWKS when the rotated key joined it."""


def jwk(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, kid: str) -> dict[str, Any]:
    if isinstance(key, rsa.RSAPrivateKey):
        public: dict[str, Any] = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
        return public | {"kid": kid, "alg": "RS256", "use": "sig"}
    public = ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
    return public | {"kid": kid, "alg": "ES256", "use": "sig"}


@pytest.fixture(scope="module")
def keys() -> KeyPairs:
    return KeyPairs(
        rsa_key=rsa.generate_private_key(public_exponent=65537, key_size=2048),
        ec_key=ec.generate_private_key(ec.SECP256R1()),
        rotated_key=rsa.generate_private_key(public_exponent=65537, key_size=2048),
        served=[],
        fetches=[],
    )


@pytest.fixture(scope="module")
def jwks_url(keys: KeyPairs) -> Iterator[str]:
    """A JWKS endpoint on a real socket, as an identity provider publishes its keys."""
    keys.served.append(jwk(keys.rsa_key, "url-rsa-1"))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            keys.fetches.append(time.monotonic())
            body = json.dumps({"keys": list(keys.served)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="jwks", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/realms/ops/protocol/openid-connect/certs"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def launched(
    api_stack: ApiStack, keys: KeyPairs, jwks_url: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, ApiProcess]:
    """The other configurations, started before the module's API so that all boot together: an
    identity provider's HS256 tokens (issuer, audience, roles under realm_access), a JWKS file with
    an RSA and an EC key, and a JWKS URL."""
    jwks_file = tmp_path_factory.mktemp("jwks") / "jwks.json"
    jwks_file.write_text(json.dumps({"keys": [jwk(keys.rsa_key, "rsa-1"), jwk(keys.ec_key, "ec-1")]}))
    configs = {
        "idp": {
            "SCHEDULER_JWT_ISSUER": ISSUER,
            "SCHEDULER_JWT_AUDIENCE": AUDIENCE,
            "SCHEDULER_JWT_ROLES_CLAIM": "realm_access.roles",
            "SCHEDULER_JWT_APPS_CLAIM": "resource_access.apps",
        },
        "file": {"SCHEDULER_JWT_SECRET": "", "SCHEDULER_JWT_JWKS": str(jwks_file)},
        "url": {"SCHEDULER_JWT_SECRET": "", "SCHEDULER_JWT_JWKS": jwks_url},
        # An identity provider the API cannot reach (a port nothing listens on).
        "unreachable": {
            "SCHEDULER_JWT_SECRET": "",
            "SCHEDULER_JWT_JWKS": f"http://127.0.0.1:{free_port()}/certs?client_secret=s3cr3t-in-query",
        },
    }
    return {name: api_stack.start(env, wait=False) for name, env in configs.items()}


@pytest.fixture(scope="module")
def extra_apis(launched: dict[str, ApiProcess], api: ApiProcess, keys: KeyPairs) -> Iterator[dict[str, Api]]:
    for name, process in launched.items():
        wait_for(functools.partial(_serving, process), 60, f"the {name} API to serve")
    started = {
        name: Api(process, HttpCaller(process.http_url), GrpcCaller(process.grpc_target))
        for name, process in launched.items()
    }
    try:
        # The identity provider rotates right after the API first fetched its keys; PyJWT's
        # cooldown between fetches then runs out while the other tests run.
        assert started["url"].http.call(*READ_CALL, rs256(keys.rsa_key, "url-rsa-1")).ok
        keys.rotated_after = len(keys.fetches)
        keys.served.append(jwk(keys.rotated_key, ROTATED_KID))
        yield started
    finally:
        # Stopped together rather than one after another; the harness checks each exit code.
        for one in started.values():
            one.http.close()
            one.grpc.close()
            one.process.component.proc.terminate()
        for one in started.values():
            one.process.component.proc.wait(60)


def idp_token(secret: str = SECRET, **extra: Any) -> str:
    body = claims(iss=ISSUER, aud=AUDIENCE, realm_access={"roles": [ADMIN]}) | extra
    body.pop("roles")
    return jwt.encode({k: v for k, v in body.items() if v is not None}, secret, algorithm="HS256")


def test_issuer_and_audience_are_checked_when_configured(
    caller: Caller, extra_apis: dict[str, Api], sent: list[str]
) -> None:
    idp = extra_apis["idp"].same_transport(caller)
    accepted(idp, idp_token(), sent)
    accepted(idp, idp_token(aud=["account", AUDIENCE]), sent)
    refused(idp, idp_token(aud="another-api"), sent)
    refused(idp, idp_token(aud=None), sent)
    refused(idp, idp_token(iss="https://idp.example/realms/elsewhere"), sent)
    refused(idp, idp_token(iss=None), sent)
    # The module's API sets neither: any issuer, but no audience, since a token issued for another
    # service (by an identity provider they share) is not one for this API.
    accepted(caller, token(iss="https://anyone.example"), sent)
    refused(caller, token(aud="anything"), sent)


def _with_null(claim: str) -> str:
    """An identity provider's token whose ``claim`` is there, as null (idp_token leaves out Nones)."""
    body = claims(iss=ISSUER, aud=AUDIENCE, realm_access={"roles": [ADMIN]}, **{claim: None})
    body.pop("roles")
    return jwt.encode(body, SECRET, algorithm="HS256")


def test_a_nested_apps_claim_whose_parent_is_no_object_grants_no_app(
    caller: Caller, extra_apis: dict[str, Api], sent: list[str]
) -> None:
    """Only an admin token without the claim sees every app; a parent that is there but holds no
    claims (a list, a string) is no absent claim."""
    idp = extra_apis["idp"].same_transport(caller)
    assert idp.call("ListRuns", {"app": "alpha"}, idp_token()).ok, "no resource_access at all: every app"
    parents: list[Any] = [None, [], "none", 0]
    for parent in parents:
        bearer = idp_token(resource_access=parent) if parent is not None else _with_null("resource_access")
        sent.append(bearer)
        assert idp.call("ListRuns", {"app": "alpha"}, bearer).code == "NOT_FOUND", parent
    scoped = idp_token(resource_access={"apps": ["alpha"]})
    sent.append(scoped)
    assert idp.call("ListRuns", {"app": "alpha"}, scoped).ok


def test_roles_are_read_from_the_configured_claim_path(
    caller: Caller, extra_apis: dict[str, Api], sent: list[str]
) -> None:
    idp = extra_apis["idp"].same_transport(caller)
    viewer = idp_token(realm_access={"roles": ["offline_access", VIEWER]})
    accepted(idp, viewer, sent)
    create = {"app": "alpha", "name": "by-viewer", "handler": "builtin:noop", "cron_expression": "0 3 * * *"}
    assert idp.call("CreateSchedule", create, viewer).code == "PERMISSION_DENIED"
    # Roles at the top level are not where this API looks: no scheduler role at all.
    top_level = idp_token(realm_access={"roles": ["offline_access"]}, roles=[ADMIN])
    sent.append(top_level)
    assert idp.call(*READ_CALL, top_level).code == "PERMISSION_DENIED"


# --- key pairs -------------------------------------------------------------------------------------


def rs256(key: rsa.RSAPrivateKey, kid: str, **extra: Any) -> str:
    return jwt.encode(claims(**extra), key, algorithm="RS256", headers={"kid": kid})


def public_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def test_rs256_and_es256_tokens_verify_against_a_jwks_file(
    caller: Caller, extra_apis: dict[str, Api], keys: KeyPairs, sent: list[str]
) -> None:
    keyed = extra_apis["file"].same_transport(caller)
    accepted(keyed, rs256(keys.rsa_key, "rsa-1"), sent)
    accepted(keyed, jwt.encode(claims(), keys.ec_key, algorithm="ES256", headers={"kid": "ec-1"}), sent)


def test_forged_tokens_are_refused_by_a_key_pair_api(
    caller: Caller, extra_apis: dict[str, Api], keys: KeyPairs, sent: list[str]
) -> None:
    keyed = extra_apis["file"].same_transport(caller)
    # Algorithm confusion: the RSA public key (which anyone may have) used as an HMAC secret.
    pem = public_pem(keys.rsa_key)
    confused = hand_made(
        {"alg": "HS256", "typ": "JWT", "kid": "rsa-1"},
        claims(),
        lambda data: hmac.new(pem, data, hashlib.sha256).digest(),
    )
    refused(keyed, confused, sent)
    impostor = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    refused(keyed, rs256(impostor, "rsa-1"), sent)
    refused(keyed, rs256(keys.rsa_key, "no-such-kid"), sent)
    refused(keyed, hand_made({"alg": "none", "typ": "JWT", "kid": "rsa-1"}, claims(), lambda _: b""), sent)
    # A token signed with the EC key but claiming the RSA key's kid.
    refused(keyed, jwt.encode(claims(), keys.ec_key, algorithm="ES256", headers={"kid": "rsa-1"}), sent)
    refused(keyed, token(), sent)  # an HS256 token is no use where only key pairs are configured
    refused(keyed, rs256(keys.rsa_key, "rsa-1", exp=int(time.time()) - LEEWAY_S - 60), sent)


# --- the API refuses to start without a sound key configuration ------------------------------------


def test_the_api_refuses_to_start_without_a_sound_key(
    api_stack: ApiStack, tmp_path: Path, keys: KeyPairs
) -> None:
    jwks_file = tmp_path / "jwks.json"
    jwks_file.write_text(json.dumps({"keys": [jwk(keys.rsa_key, "rsa-1")]}))
    base = {k: v for k, v in api_stack.env.items() if not k.startswith("SCHEDULER_JWT_")}
    short = "too-short-a-secret"
    cases: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
        "no key": ({}, ("SCHEDULER_JWT_SECRET", "SCHEDULER_JWT_JWKS")),
        "short secret": ({"SCHEDULER_JWT_SECRET": short}, ("SCHEDULER_JWT_SECRET",)),
        "both": (
            {"SCHEDULER_JWT_SECRET": SECRET, "SCHEDULER_JWT_JWKS": str(jwks_file)},
            ("SCHEDULER_JWT_SECRET", "SCHEDULER_JWT_JWKS"),
        ),
        "none with a secret": (
            {"SCHEDULER_JWT_SECRET": SECRET, "SCHEDULER_JWT_ALGORITHMS": "HS256,none"},
            ("SCHEDULER_JWT_ALGORITHMS",),
        ),
        "none with a jwks": (
            {"SCHEDULER_JWT_JWKS": str(jwks_file), "SCHEDULER_JWT_ALGORITHMS": "none"},
            ("SCHEDULER_JWT_ALGORITHMS",),
        ),
        "hs256 with a jwks": (
            {"SCHEDULER_JWT_JWKS": str(jwks_file), "SCHEDULER_JWT_ALGORITHMS": "RS256,HS256"},
            ("SCHEDULER_JWT_ALGORITHMS",),
        ),
    }
    ports = ["--port", str(free_port()), "--grpc-port", str(free_port()), "--metrics-port", str(free_port())]
    started = {
        name: subprocess.Popen(
            [SCHEDULER, "run", "api", *ports],
            env=base | extra,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (extra, _) in cases.items()
    }
    for name, proc in started.items():
        try:
            _, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError(f"{name}: the API started") from None
        lines = stderr.strip().splitlines()
        assert proc.returncode == 2, f"{name}: exit {proc.returncode}: {stderr}"
        assert len(lines) == 1, f"{name}: {stderr}"
        for variable in cases[name][1]:
            assert variable in lines[0], f"{name}: {lines[0]}"
        assert SECRET not in stderr and short not in stderr, f"{name}: {lines[0]}"


# --- roles -----------------------------------------------------------------------------------------

CALL_ORDER = (
    "CreateSchedule", "CreateSchedules", "GetSchedule", "ListSchedules", "UpdateSchedule",
    "PauseSchedule", "ResumeSchedule", "TriggerSchedule", "GetScheduleHistory", "GetRun", "ListRuns",
    "ListDeadLetters", "ListAuditEntries", "ReplayDeadLetters", "DeleteSchedule",
)  # fmt: skip
READS = {
    "GetSchedule",
    "ListSchedules",
    "GetScheduleHistory",
    "GetRun",
    "ListRuns",
    "ListDeadLetters",
    "ListAuditEntries",
}
USER_WRITES = {
    "CreateSchedule", "CreateSchedules", "UpdateSchedule", "PauseSchedule", "ResumeSchedule",
    "TriggerSchedule",
}  # fmt: skip


def new_schedule(name: str) -> dict[str, Any]:
    return {"app": "alpha", "name": name, "handler": "builtin:noop", "cron_expression": "0 3 * * *"}


def request_for(method: str, schedule_id: str, run_id: str) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    return {
        "CreateSchedule": new_schedule(f"role-{tag}"),
        "CreateSchedules": {"schedules": [new_schedule(f"role-batch-{tag}")]},
        "UpdateSchedule": {"id": schedule_id, "description": f"changed {tag}"},
        "ListSchedules": {},
        "GetRun": {"id": run_id},
        "ListRuns": {"app": "alpha"},
        "ListDeadLetters": {},
        "ListAuditEntries": {},
        "ReplayDeadLetters": {"app": "alpha"},
    }.get(method, {"id": schedule_id})


@dataclass
class Objects:
    schedule_id: str
    run_id: str


def alpha_objects(caller: Caller) -> Objects:
    """A fresh schedule in alpha with one run, made by an admin."""
    admin = token(subject="setup")
    made = caller.call("CreateSchedule", new_schedule(f"roles-{uuid.uuid4().hex[:8]}"), admin)
    assert made.ok, made
    fired = caller.call("TriggerSchedule", {"id": made.body["id"]}, admin)
    assert fired.ok, fired
    return Objects(made.body["id"], fired.body["run_id"])


def check_role(caller: Caller, bearer: str, allowed: set[str]) -> None:
    objects = alpha_objects(caller)
    answers: dict[str, Outcome] = {}
    for method in CALL_ORDER:
        answers[method] = caller.call(
            method, request_for(method, objects.schedule_id, objects.run_id), bearer
        )
    wrong = {
        method: (outcome.code, outcome.body.get("message"))
        for method, outcome in answers.items()
        if (not outcome.ok if method in allowed else outcome.code != "PERMISSION_DENIED")
    }
    assert not wrong, wrong
    for method, outcome in answers.items():
        if method not in allowed:
            if outcome.grpc_status is None:
                assert outcome.http_status == 403
            else:
                assert outcome.grpc_status == grpc.StatusCode.PERMISSION_DENIED


def test_a_viewer_may_only_read(caller: Caller) -> None:
    check_role(caller, token(subject="vera", roles=(VIEWER,), apps=["alpha"]), READS)


def test_a_user_may_change_schedules_but_not_cancel_them_nor_replay(caller: Caller) -> None:
    check_role(caller, token(subject="ulla", roles=(USER,), apps=["alpha"]), READS | USER_WRITES)


def test_an_admin_may_do_everything(caller: Caller) -> None:
    check_role(caller, token(subject="ada", roles=(ADMIN,)), set(CALL_ORDER))


@pytest.mark.parametrize("roles", [(), ("offline_access", "scheduler_admin")], ids=["none", "others"])
def test_a_token_without_a_scheduler_role_may_do_nothing(caller: Caller, roles: tuple[str, ...]) -> None:
    check_role(caller, token(subject="nobody", roles=roles, apps=["*"]), set())


def test_a_refused_write_changes_nothing(caller: Caller) -> None:
    objects = alpha_objects(caller)
    admin = token(subject="setup")
    before = caller.call("GetSchedule", {"id": objects.schedule_id}, admin)
    viewer = token(subject="vera", roles=(VIEWER,), apps=["alpha"])
    for method in ("UpdateSchedule", "PauseSchedule", "DeleteSchedule", "TriggerSchedule"):
        request = request_for(method, objects.schedule_id, objects.run_id)
        assert caller.call(method, request, viewer).code == "PERMISSION_DENIED"
    after = caller.call("GetSchedule", {"id": objects.schedule_id}, admin)
    assert (after.body["version"], after.body["state"]) == (before.body["version"], before.body["state"])
    history = caller.call("GetScheduleHistory", {"id": objects.schedule_id}, admin)
    assert [run["id"] for run in history.body["runs"]] == [objects.run_id]


# --- a JWKS URL, and a key rotated in while the API runs -------------------------------------------


def test_a_jwks_url_is_followed_through_key_rotation(
    caller: Caller, extra_apis: dict[str, Api], keys: KeyPairs, sent: list[str]
) -> None:
    remote = extra_apis["url"]
    keyed = remote.same_transport(caller)
    accepted(keyed, rs256(keys.rsa_key, "url-rsa-1"), sent)
    refused(keyed, rs256(keys.rsa_key, "rsa-1"), sent)  # the file's kid is not the URL's
    assert keys.rotated_after is not None, "the rotated key was published before the API fetched"
    rotated = rs256(keys.rotated_key, ROTATED_KID)
    sent.append(rotated)
    # PyJWT fetches the set again for an unknown kid at most every 30 s (its cooldown).
    wait_for(lambda: keyed.call(*READ_CALL, rotated).ok, 45, "the API to accept the rotated key")
    assert len(keys.fetches) > keys.rotated_after
    accepted(keyed, rs256(keys.rsa_key, "url-rsa-1"), sent)  # the old key still works beside it
    assert remote.process.component.proc.poll() is None, "the API restarted"


def test_an_identity_provider_out_of_reach_is_unavailable_logged_and_counted(
    caller: Caller, extra_apis: dict[str, Api], keys: KeyPairs, sent: list[str]
) -> None:
    """Not the token's fault: UNAVAILABLE (which the error ratio alert counts), not UNAUTHENTICATED,
    and the operator is told why, once however many calls fail."""
    down = extra_apis["unreachable"]
    keyed = down.same_transport(caller)
    bearer = rs256(keys.rsa_key, "url-rsa-1")
    sent.append(bearer)
    for _ in range(3):
        outcome = keyed.call(*READ_CALL, bearer)
        assert outcome.code == "UNAVAILABLE", outcome
        assert outcome.http_status in (None, 503) and outcome.grpc_status in (
            None,
            grpc.StatusCode.UNAVAILABLE,
        )
    with urllib.request.urlopen(
        f"http://127.0.0.1:{down.process.metrics_port}/metrics", timeout=10
    ) as answer:
        scraped = answer.read().decode()
    [counted] = [
        line for line in scraped.splitlines() if line.startswith("scheduler_api_jwks_fetch_errors_total ")
    ]
    assert float(counted.split()[1]) >= 3
    log = down.process.component.output()
    warned = [line for line in log.splitlines() if "cannot fetch the signing keys from" in line]
    assert 1 <= len(warned) < float(counted.split()[1]), "one line per 30 s, not one per call"
    assert "/certs" in warned[0] and "s3cr3t-in-query" not in log


# --- secrets stay secret ---------------------------------------------------------------------------


def test_no_secret_or_token_reaches_the_log(
    api_stack: ApiStack, extra_apis: dict[str, Api], keys: KeyPairs, sent: list[str]
) -> None:
    """Last in this module, so that every API here has seen every kind of token by now; it sends a
    few refused ones of its own to each, so that it checks something when run alone too."""
    for name, one in extra_apis.items():
        if name == "unreachable":  # it answers UNAVAILABLE to every token; its log is read below
            continue
        for caller in (one.http, one.grpc):
            for bearer in (
                token(secret="another-secret-that-is-also-32-bytes-long"),
                token(ttl_s=-(LEEWAY_S + 60)),
                rs256(rsa.generate_private_key(public_exponent=65537, key_size=2048), "rsa-1"),
            ):
                sent.append(bearer)
                assert caller.call(*READ_CALL, bearer).code == "UNAUTHENTICATED"
    signatures = [text.rsplit(".", 1)[-1] for text in sent if text.count(".") == 2]
    secrets = [SECRET, *sent, *(signature for signature in signatures if len(signature) >= 16)]
    for process in api_stack.processes:
        log = process.component.output()
        leaked = [text[:12] + "..." for text in secrets if text in log]
        assert not leaked, f"the log of the API at {process.http_url} holds {leaked}"
