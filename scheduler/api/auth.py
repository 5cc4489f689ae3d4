"""Who is calling: JWT bearer tokens verified with PyJWT, and what their roles and apps allow.

The algorithms a token may use are pinned by configuration to the kind of key configured (HMAC for
a secret, key pairs for a JWKS), so ``alg: none`` and an HS256 token "signed" with an RSA public key
are refused before any signature is checked. ``exp`` and ``sub`` are required; ``nbf``, ``iss`` and
``aud`` are checked (the last two when configured) with a small leeway for clock skew.

Roles: ``SCHEDULER_ADMIN`` may do everything, ``SCHEDULER_USER`` may read, trigger, create and change
schedules (not cancel them, nor replay dead letters), ``SCHEDULER_VIEWER`` may only read. Apps: the
token's apps claim lists the apps it may see (``*``: all); an admin's token that has no apps
claim at all sees all (one with the claim null sees none).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any

import jwt

from scheduler.api import metrics
from scheduler.api.errors import ApiError, Code
from scheduler.config import JwtSettings

log = logging.getLogger(__name__)

JWKS_FILE_RECHECK_S = 10.0
JWKS_URL_LIFESPAN_S = 300
JWKS_URL_TIMEOUT_S = 5
# A token naming a key id the cached set lacks fetches the set again (a rotation), at most this often
# (a flood of made-up key ids costs the identity provider one fetch per period).
JWKS_URL_REFETCH_S = 5
# A JWKS URL that does not answer is logged at most this often: every call would say it again.
JWKS_URL_WARNING_S = 30.0
MAX_TOKEN_BYTES = 16 * 1024
# A subject or issuer is who rate limits and idempotency keys count, whole: a longer one is refused,
# never cut (two subjects alike in their first characters would be one principal). Kubernetes
# service accounts' subjects are at most 339 characters.
MAX_IDENTITY_BYTES = 512
ALL_APPS = "*"


class Role(StrEnum):
    ADMIN = "SCHEDULER_ADMIN"
    USER = "SCHEDULER_USER"
    VIEWER = "SCHEDULER_VIEWER"


class Access(Enum):
    READ = "read"
    TRIGGER = "trigger"
    WRITE = "write"  # create, update, pause, resume
    ADMIN = "admin"  # cancel (delete), replay dead letters


GRANTS: dict[Role, frozenset[Access]] = {
    Role.ADMIN: frozenset(Access),
    Role.USER: frozenset({Access.READ, Access.TRIGGER, Access.WRITE}),
    Role.VIEWER: frozenset({Access.READ}),
}


@dataclass(frozen=True)
class Principal:
    subject: str
    issuer: str | None
    roles: frozenset[Role]
    apps: frozenset[str] | None
    """The apps it may see; None: every app."""

    @property
    def key(self) -> str:
        """Who the rate limits and idempotency keys count: a subject is unique within its issuer.
        ``issuer|subject``, with a "|" or "\\" inside either escaped by a "\\": joined as they
        were, issuer "a" with subject "b|c" was the same principal as issuer "a|b" with subject
        "c". Escaped, not encoded anew, so that the keys of the principals without either
        character, which the rate buckets and the idempotency records of a running API hold,
        stay what they were across the upgrade."""
        return f"{_escaped(self.issuer or '')}|{_escaped(self.subject)}"

    @property
    def actor(self) -> str:
        """Who the audit log names."""
        return f"api:{self.subject}"

    def may(self, access: Access) -> bool:
        return any(access in GRANTS[role] for role in self.roles)

    def sees(self, app: str | None) -> bool:
        return self.apps is None or (app is not None and app in self.apps)

    def scope(self) -> list[str] | None:
        """The apps a listing may show (None: any)."""
        return None if self.apps is None else sorted(self.apps)


def _unauthenticated(reason: str) -> ApiError:
    return ApiError(Code.UNAUTHENTICATED, reason)


# What a token that does not verify is told, in words rather than PyJWT's class names; the first
# that the error is an instance of (InvalidSignatureError is a DecodeError).
_INVALID_TOKEN_REASONS: tuple[tuple[type[jwt.InvalidTokenError], str], ...] = (
    (jwt.InvalidSignatureError, "the token's signature does not verify"),
    (jwt.DecodeError, "the token is not a well-formed JWT (three base64url parts, a JSON header and claims)"),
    (jwt.InvalidAlgorithmError, "the token's algorithm is not accepted"),
    (jwt.InvalidIssuedAtError, "the token's 'iat' claim is not a time"),
    (jwt.exceptions.InvalidSubjectError, "the token's 'sub' claim must be a non-empty string"),
    (jwt.exceptions.InvalidJTIError, "the token's 'jti' claim must be a string"),
)


def _why_invalid(exc: jwt.InvalidTokenError) -> str:
    return next(
        (text for kind, text in _INVALID_TOKEN_REASONS if isinstance(exc, kind)), "the token is not valid"
    )


# A claim the token does not have, told apart from one it has with the value null.
_ABSENT: Any = object()


def _claim(claims: dict[str, Any], path: str) -> Any:
    """A claim by dotted path (``realm_access.roles``), as identity providers nest them;
    :data:`_ABSENT` if the token has no such claim."""
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, dict):
            return None  # a parent that is there but holds no claims (null): not an absent claim
        if part not in value:
            return _ABSENT
        value = value[part]
    return value


def _names(value: Any) -> list[str]:
    """A claim holding names: a list of strings, or one string of names separated by spaces or commas."""
    if isinstance(value, str):
        return [name for name in value.replace(",", " ").split() if name]
    if isinstance(value, list) and all(isinstance(name, str) for name in value):
        return value
    return []  # anything else is no list of names, and names none (not the strings it holds)


def the_authorization(values: Sequence[str]) -> str | None:
    """The one ``Authorization`` value a request carries, if any. Two are refused, never one of them
    taken: a proxy in front that reads the other one would see another caller than the API does."""
    if len(values) > 1:
        raise _unauthenticated(f"the request carries {len(values)} Authorization headers; send one")
    return values[0] if values else None


def _check_times(claims: dict[str, Any]) -> None:
    """RFC 7519's times are numbers (NumericDate). PyJWT reads "9999999999" as one, and ``true`` as
    1 (long expired): either is refused for its type, also when PyJWT found it expired (it checks
    the signature first, so these claims are the signer's)."""
    for name in ("exp", "nbf", "iat"):
        value = claims.get(name)
        if name in claims and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _unauthenticated(f"the token's {name!r} claim must be a number (seconds since the epoch)")


class _JwksFile:
    """The keys of a JWKS file, read again when the file changes (a rotated, mounted Secret)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._checked = 0.0
        self._mtime: float | None = None
        self._keys: dict[str | None, jwt.PyJWK] = {}

    def key(self, kid: str | None) -> jwt.PyJWK:
        with self._lock:
            if time.monotonic() - self._checked > JWKS_FILE_RECHECK_S or kid not in self._keys:
                self._reload()
            keys = self._keys
        if kid in keys:
            return keys[kid]
        if kid is None and len(keys) == 1:
            return next(iter(keys.values()))
        raise _unauthenticated("the token's signing key is not among the configured keys")

    def _reload(self) -> None:
        self._checked = time.monotonic()
        try:
            mtime = self.path.stat().st_mtime
            if mtime == self._mtime:
                return
            keys = jwt.PyJWKSet.from_dict(json.loads(self.path.read_text(encoding="utf-8"))).keys
        except (OSError, ValueError, jwt.PyJWKSetError) as exc:
            if self._keys:
                return  # keep the keys that worked; the file may be mid-rotation
            # What is wrong with the file is the operator's to read, in the server's log.
            log.warning("the JWKS file %s cannot be read: %s", self.path, exc)
            raise _unauthenticated("the configured keys cannot be read") from None
        self._mtime = mtime
        self._keys = {key.key_id: key for key in keys}


class Authenticator:
    def __init__(self, settings: JwtSettings) -> None:
        if not settings.configured:
            raise ValueError("no JWT key configured")
        self.settings = settings
        self._file: _JwksFile | None = None
        self._client: jwt.PyJWKClient | None = None
        self._warned_lock = threading.Lock()
        self._next_warning = 0.0
        if settings.jwks is not None:
            if settings.jwks.startswith(("https://", "http://")):
                self._client = jwt.PyJWKClient(
                    settings.jwks,
                    cache_keys=True,
                    lifespan=JWKS_URL_LIFESPAN_S,
                    timeout=JWKS_URL_TIMEOUT_S,
                    cooldown_duration=JWKS_URL_REFETCH_S,
                )
            else:
                self._file = _JwksFile(settings.jwks)

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization: Bearer <token>`` value; raises UNAUTHENTICATED."""
        if not authorization:
            raise _unauthenticated("a bearer token is required (Authorization: Bearer <token>)")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _unauthenticated("the Authorization header must be 'Bearer <token>'")
        if len(token) > MAX_TOKEN_BYTES:
            raise _unauthenticated("the token is too long")
        claims = self._verify(token)
        return self._principal(claims)

    def _verify(self, token: str) -> dict[str, Any]:
        s = self.settings
        try:
            header = jwt.get_unverified_header(token)
            algorithm = header.get("alg")
            if algorithm not in s.algorithms:
                raise _unauthenticated(
                    f"the token's algorithm {str(algorithm)[:20]!r} is not accepted "
                    f"(accepted: {', '.join(s.algorithms)})"
                )
            key: Any = s.secret
            if self._file is not None:
                key = self._file.key(header.get("kid"))
            elif self._client is not None:
                key = self._client.get_signing_key_from_jwt(token)
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=list(s.algorithms),
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway_s,
                # The audience is always checked: with none configured, a token naming one (one an
                # identity provider shared with other services issued for them) is refused.
                options={"require": ["exp", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            _check_times(jwt.decode(token, options={"verify_signature": False}))
            raise _unauthenticated("the token has expired") from None
        except jwt.ImmatureSignatureError:
            _check_times(jwt.decode(token, options={"verify_signature": False}))
            raise _unauthenticated("the token is not valid yet (its nbf or iat is in the future)") from None
        except jwt.InvalidAudienceError:
            if s.audience is None:
                raise _unauthenticated(
                    "the token is for an audience (aud), and this API accepts none"
                ) from None
            raise _unauthenticated("the token is for another audience") from None
        except jwt.InvalidIssuerError:
            raise _unauthenticated("the token is from another issuer") from None
        except jwt.MissingRequiredClaimError as exc:
            raise _unauthenticated(f"the token has no {exc.claim!r} claim") from None
        except jwt.PyJWKClientConnectionError as exc:
            # The identity provider, or the way to it, failed, not the token: the server's fault, so
            # UNAVAILABLE (which the API's error ratio alert counts), logged and counted.
            self._jwks_unreachable(exc)
            raise ApiError(
                Code.UNAVAILABLE, "the signing keys cannot be fetched from the identity provider; try again"
            ) from None
        except jwt.PyJWKClientError:
            raise _unauthenticated("the token's signing key cannot be found") from None
        except jwt.InvalidTokenError as exc:
            raise _unauthenticated(_why_invalid(exc)) from None
        _check_times(claims)
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise _unauthenticated("the token's 'sub' claim must be a non-empty string")
        if "iss" in claims and (not isinstance(claims["iss"], str) or not claims["iss"]):
            # Read as no issuer, a token saying `"iss": 5` or `"iss": ""` would share the rate
            # limits and idempotency keys of the subject's tokens without one.
            raise _unauthenticated("the token's 'iss' claim must be a non-empty string")
        if any("\x00" in claims.get(name, "") for name in ("sub", "iss")):
            # PostgreSQL's text cannot hold one: the principal's rate bucket could not be kept.
            raise _unauthenticated("the token's 'sub' and 'iss' claims must not contain NUL")
        for name in ("sub", "iss"):
            value = claims.get(name)
            if isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) > MAX_IDENTITY_BYTES:
                shown = f"the token's {name!r} claim is longer than {MAX_IDENTITY_BYTES} bytes"
                raise _unauthenticated(shown)
        return claims

    def _jwks_unreachable(self, exc: Exception) -> None:
        metrics.JWKS_FETCH_ERRORS.inc()
        now = time.monotonic()
        with self._warned_lock:
            if now < self._next_warning:
                return
            self._next_warning = now + JWKS_URL_WARNING_S
        # The URL's path is shown without its query, which could carry a credential.
        shown = (self.settings.jwks or "").partition("?")[0]
        log.warning("cannot fetch the signing keys from %s: %s", shown, exc)

    def _principal(self, claims: dict[str, Any]) -> Principal:
        s = self.settings
        roles = frozenset(Role(name) for name in _names(_claim(claims, s.roles_claim)) if name in set(Role))
        apps_claim = _claim(claims, s.apps_claim)
        apps = _names(apps_claim)
        # Only an admin's token that has no apps claim at all sees every app: one that has the
        # claim with null, or anything that is no list of names, sees none (an identity provider's
        # "no apps" must not read as "all apps").
        every_app = ALL_APPS in apps or (apps_claim is _ABSENT and Role.ADMIN in roles)
        scope = None if every_app else frozenset(apps)
        return Principal(
            subject=claims["sub"],
            issuer=claims.get("iss"),
            roles=roles,
            apps=scope,
        )


def _escaped(part: str) -> str:
    return part.replace("\\", "\\\\").replace("|", "\\|")


def issue_token(
    secret: str,
    subject: str,
    roles: Iterable[Role | str],
    apps: Iterable[str] | None,
    ttl_s: float = 3600.0,
    **claims: Any,
) -> str:
    """An HS256 token for the demo and the tests: the API itself never issues tokens to clients."""
    now = int(time.time())
    body: dict[str, Any] = {
        "sub": subject,
        "iat": now,
        "exp": now + int(ttl_s),
        "roles": [str(r) for r in roles],
    }
    if apps is not None:
        body["apps"] = list(apps)
    return jwt.encode(body | claims, secret, algorithm="HS256")
