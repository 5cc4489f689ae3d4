"""Redaction: what keeps secrets and sensitive values out of logs, PostgreSQL error columns and Kafka.

The log formatter of :mod:`scheduler.telemetry.logs` runs every line through it, and code that stores
an error text (a run's ``last_error``, a dead letter's reason, a rejected command) calls it before
writing, because those texts outlive the process and are read by people who do not hold the secrets:

- :func:`redact_text` masks, in free text, the password of any ``scheme://user:password@host`` URL,
  every query-string and fragment value of a URL (and every query value of a path without a scheme,
  ``/v1/traces?sig=...``, as HTTP clients word a request), the token after ``Bearer`` anywhere, the value
  of every ``key=value``, ``key: value`` or ``"key": "value"`` whose key is sensitive (after its auth
  scheme, as in ``Authorization: Basic ***``), and the row PostgreSQL quotes in a refusal's
  ``Failing row contains (...)`` (to the end of the text).
- :func:`redact_mapping` masks, in a nested mapping, the values of the sensitive keys and redacts the
  text of the others.
- :func:`describe_payload` says what a job payload is shaped like without saying what is in it, for
  a component that wants to mention a payload (payload values are never logged).
- :func:`mask_payload_values` masks, in a handler's error text, the values of its job's payload
  that the text quotes.

A key is sensitive when one of the patterns matches part of its name, case-insensitively: the
defaults (:data:`DEFAULT_SENSITIVE_KEYS`) plus the comma-separated regular expressions of
``SCHEDULER_REDACT_KEYS``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Final, TypeVar

MASK: Final = "***"

K = TypeVar("K")

DEFAULT_SENSITIVE_KEYS: Final[tuple[str, ...]] = (
    "password",
    "passwd",
    "secret",
    "token",
    "authorization",
    "api[-_]?key",
    "credential",
    "cookie",
    "session",
    "private[-_]?key",
    "sasl",
)

REDACT_KEYS_ENV: Final = "SCHEDULER_REDACT_KEYS"

# Deeper than any real error or config mapping; past it the value is masked rather than walked, so a
# cyclic structure ends instead of recursing without end.
_MAX_DEPTH: Final = 32

# scheme://[userinfo@]authority[path][?query][#fragment], for any scheme (postgresql, https, redis,
# and Kafka's listener names, hence "_"). The userinfo is greedy up to the last "@" of the authority
# because passwords are often written with an unescaped "@".
_URL: Final = re.compile(
    r"""(?P<scheme>\b[a-zA-Z][\w+.\-]*://)
        (?:(?P<userinfo>[^\s/?#"'<>`]*)@)?
        (?P<rest>[^\s?#"'<>`]*)
        (?:\?(?P<query>[^\s#"'<>`]*))?
        (?:\#(?P<fragment>[^\s"'<>`]*))?""",
    re.VERBOSE,
)
# Schemes whose lone userinfo is a role name, never a secret (postgresql://scheduler@host/db).
_USER_ONLY_SCHEMES: Final = frozenset({"postgresql://", "postgres://"})
_QUERY_PARAM: Final = re.compile(r"(?P<name>[^&;=]*)(?P<eq>=?)(?P<value>[^&;]*)")
# A path with a query but no scheme, as HTTP clients word a request (urllib3's "Max retries exceeded
# with url: /v1/traces?sig=..."): its query values are masked as a whole URL's are.
# In both, the punctuation that ends a query (the ")" of "(url: /v1/traces?sig=x)", a sentence's ".")
# stays outside the mask as the text's own (_masked_query): it would otherwise go with the last value.
_QUERY_END: Final = ").,;:!"
_PATH_QUERY: Final = re.compile(r"""(?P<path>/[^\s?#"'<>`]*)\?(?P<query>[^\s#"'<>`]*)""")

# A key, optionally quoted, then ":" or "=" on the same line, then a value: quoted (with escapes), or
# bare up to a separator. A value that opens an object or a list is left to the keys inside it, and
# "name://" is a URL (a Kafka listener such as SASL_SSL://host:9092), not a key and its value.
# The value is in a lookahead, so a match consumes only "key=": the value of a key that is not
# sensitive ("failed: sasl.password=x") is searched for keys in turn. The key is tested against the
# sensitive patterns in code, so that configured patterns with anchors keep their meaning.
_KEY_VALUE: Final = re.compile(
    r"""(?<![\w.\-])(?P<q>["']?)(?P<key>[A-Za-z_][\w.\-]*)(?P=q)
        (?P<sep>[ \t]*[:=][ \t]*)(?!//)
        (?=(?P<scheme>(?:Bearer|Basic|Digest|Token|Negotiate)[ \t]+)?
           (?P<value>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|(?![{\[])[^\s,;&"'(){}\[\]<>]+))""",
    re.VERBOSE | re.IGNORECASE,
)
# PostgreSQL's detail of a refused row ("Failing row contains (id, app, ..., payload, ...)"), in a
# psycopg error's text: the whole row, payload values too. Masked to the end of the text, since a
# text column of the row may hold a line break, and the row is the error's last line.
_FAILING_ROW: Final = re.compile(r"(?P<lead>Failing row contains )\(.*", re.DOTALL)
# A bearer token wherever it appears, not only after "Authorization:". Only "Bearer": the other
# scheme names (Basic, Digest) are English words, masked only after a sensitive key.
_BEARER: Final = re.compile(r"\b(?P<scheme>Bearer)[ \t]+[\w.~+/\-]+=*", re.IGNORECASE)


# Every default pattern begins with a literal that any match contains, so a text with none of them
# (lowercased) cannot hold a default key: a few substring tests instead of a regex scan, which is
# what keeps an ordinary log line in microseconds. (A pattern without one gives "", which every text
# contains: slower, never wrong.)
def _leading_literal(pattern: str) -> str:
    literal = re.match(r"[a-z0-9_]*", pattern)
    text = literal[0] if literal else ""
    # "tokens?" requires "token", not "tokens": a quantifier applies to the last character.
    return text[:-1] if pattern[len(text) : len(text) + 1] in ("?", "*", "{") else text


_DEFAULT_HINTS: Final = tuple(sorted({_leading_literal(p) for p in DEFAULT_SENSITIVE_KEYS}))

# Keys repeat (the same extras on every line): their verdicts are kept, up to this many.
_VERDICTS_KEPT: Final = 4096


class Redactor:
    """The compiled patterns: build one per configuration, then call it from any thread."""

    __slots__ = ("_extra", "_keys", "_verdicts", "patterns")

    def __init__(self, extra_keys: Iterable[str] = ()) -> None:
        extra = tuple(extra_keys)
        self.patterns: tuple[str, ...] = (*DEFAULT_SENSITIVE_KEYS, *extra)
        self._keys = re.compile("|".join(f"(?:{p})" for p in self.patterns), re.IGNORECASE)
        # Configured patterns have no known literal, so a text is searched for them directly.
        self._extra = re.compile("|".join(f"(?:{p})" for p in extra), re.IGNORECASE) if extra else None
        self._verdicts: dict[str, bool] = {}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Redactor:
        """The defaults plus ``SCHEDULER_REDACT_KEYS``; a pattern that does not compile is a ValueError."""
        env = os.environ if environ is None else environ
        extra = [p.strip() for p in env.get(REDACT_KEYS_ENV, "").split(",") if p.strip()]
        for pattern in extra:
            try:
                # As it is used: inside a group of an alternation, where flags such as (?i) cannot be.
                re.compile(f"(?:{pattern})|x")
            except re.error as exc:
                raise ValueError(
                    f"{REDACT_KEYS_ENV}: {pattern!r} is not a regular expression that can be combined "
                    f"with others ({exc}); matching ignores case already"
                ) from None
        try:
            return cls(extra)
        except re.error as exc:  # each compiles, the alternation of them not (a group name twice)
            raise ValueError(f"{REDACT_KEYS_ENV}: its patterns do not combine into one ({exc})") from None

    def is_sensitive(self, key: object) -> bool:
        """Whether a key named ``key`` holds a value to mask."""
        name = str(key)
        verdict = self._verdicts.get(name)
        if verdict is None:
            verdict = self._keys.search(name) is not None
            if len(self._verdicts) >= _VERDICTS_KEPT:
                self._verdicts.clear()  # keys made of data (ids) must not grow it without end
            self._verdicts[name] = verdict
        return verdict

    def text(self, text: str) -> str:
        """``text`` with URL credentials, query values, bearer tokens and sensitive values masked."""
        # Each pass runs only when the text holds what it looks for.
        lowered = text.lower()
        if "://" in text:
            text = _URL.sub(self._url, text)
        if "?" in text and "/" in text:
            text = _PATH_QUERY.sub(_path_query, text)
        if ("=" in text or ":" in text) and self._may_hold_key(text, lowered):
            text = self._mask_values(text)
        if "bearer" in lowered:
            text = _BEARER.sub(_bearer, text)
        if "Failing row contains" in text:
            text = _FAILING_ROW.sub(rf"\g<lead>({MASK})", text)
        return text

    def _may_hold_key(self, text: str, lowered: str) -> bool:
        if any(hint in lowered for hint in _DEFAULT_HINTS):
            return True
        return self._extra is not None and self._extra.search(text) is not None

    def mapping(self, value: Mapping[K, object]) -> dict[K, object]:
        """A copy of ``value`` (recursively) with sensitive keys' values masked and texts redacted."""
        return self._mapping(value, 0)

    def value(self, value: object) -> object:
        """``value`` with the sensitive parts of its text, mappings and sequences masked."""
        return self._value(value, 0)

    def _value(self, value: object, depth: int) -> object:
        if isinstance(value, str):
            return self.text(value)
        if depth >= _MAX_DEPTH:
            return MASK
        if isinstance(value, Mapping):
            return self._mapping(value, depth)
        if isinstance(value, list | tuple | set | frozenset):
            return [self._value(item, depth + 1) for item in value]
        return value

    def _mapping(self, value: Mapping[K, object], depth: int) -> dict[K, object]:
        # None stays None: "the password is not set" is what an operator needs to see, and it
        # reveals nothing.
        return {
            key: (MASK if item is not None else None)
            if self.is_sensitive(key)
            else self._value(item, depth + 1)
            for key, item in value.items()
        }

    def _url(self, match: re.Match[str]) -> str:
        out = [match["scheme"]]
        userinfo = match["userinfo"]
        if userinfo is not None:
            user, colon, _password = userinfo.partition(":")
            if colon:
                # The name helps whoever reads the error ("role does not exist"); the password goes.
                out.append(f"{user}:{MASK}@")
            elif match["scheme"].lower() in _USER_ONLY_SCHEMES:
                out.append(f"{user}@")
            else:
                # Elsewhere a lone "x@" is often a token (https://TOKEN@github.com).
                out.append(f"{MASK}@")
        out.append(match["rest"])
        if match["query"] is not None:
            # Parameter names say what the URL was for; any value may be a token or a signature.
            out.append("?" + _masked_query(match["query"]))
        if match["fragment"] is not None:
            out.append(f"#{MASK}" if match["fragment"] else "#")
        return "".join(out)

    def _mask_values(self, text: str) -> str:
        out: list[str] = []
        done = 0  # text[:done] is in out
        for match in _KEY_VALUE.finditer(text):
            # A key inside a value already masked goes with it.
            if match.start() < done or not self.is_sensitive(match["key"]):
                continue
            value = match["value"]
            quote = value[0] if value[0] in "\"'" else ""
            out += (text[done : match.end()], match["scheme"] or "", quote, MASK, quote)
            done = match.end("value")
        if not out:
            return text
        out.append(text[done:])
        return "".join(out)


def _path_query(match: re.Match[str]) -> str:
    return f"{match['path']}?{_masked_query(match['query'])}"


def _masked_query(query: str) -> str:
    # Split in code, not in the patterns: a lazy query before the punctuation backtracks
    # quadratically on a long run of it (seconds for 20,000 characters).
    params = query.rstrip(_QUERY_END)
    if params.endswith("="):
        # The last value is that punctuation alone: it is the value, masked with it.
        params = query
    return _QUERY_PARAM.sub(_mask_param, params) + query[len(params) :]


def _mask_param(match: re.Match[str]) -> str:
    if not match[0]:
        return ""
    return f"{match['name']}={MASK}" if match["eq"] else match[0]


def _bearer(match: re.Match[str]) -> str:
    return f"{match['scheme']} {MASK}"


_default: Redactor | None = None


def default_redactor() -> Redactor:
    """The process's redactor: the one :func:`install` set, else built from the environment once."""
    global _default
    if _default is None:
        _default = Redactor.from_env()
    return _default


def install(redactor: Redactor) -> None:
    """Make ``redactor`` the one the module functions use (``configure_logging`` installs its own)."""
    global _default
    _default = redactor


def redact_text(text: str) -> str:
    """``text`` with URL credentials, query values, auth tokens and sensitive ``key=value`` masked."""
    return default_redactor().text(text)


# Shorter payload values are left: masking every "a", "ok" or "42" would garble the text and hide
# nothing worth hiding.
MIN_MASKED_CHARS: Final = 4


def exception_text(error: BaseException) -> str:
    """``str(error)``, or a note that it has none: an exception's ``__str__`` is its class's code (a
    handler's, perhaps), which may raise, and a log line or a span must still say what failed."""
    try:
        return str(error)
    except Exception:
        return "(an exception whose text could not be formatted)"


def mask_payload_values(text: str, payload: str) -> str:
    """``text`` with each string or number of the JSON ``payload`` that it quotes (one of at least
    :data:`MIN_MASKED_CHARS` characters) masked: a handler's error may quote its job's payload
    (``f"card {card} declined"``), and that error is logged, stored and published. A number is
    masked only where no digit adjoins it (``1000`` is not masked inside ``10000``); overlapping
    quotes are masked as one. See :class:`PayloadMask` for masking many texts with one payload.

    >>> mask_payload_values("card 4111-1111 declined", '{"card": "4111-1111", "retries": 3}')
    'card *** declined'
    """
    if len(text) < MIN_MASKED_CHARS:
        return text
    return PayloadMask(payload).mask(text)


class PayloadMask:
    """The values of one JSON payload that a text may quote, indexed by their first characters:
    made once (a job's log lines share it), it masks a text in time that grows with the text and
    the quotes of values it holds, not with the payload, which may be a megabyte (and a line that
    quotes the payload whole, ``log.info("got %s", payload)``, holds every value of it)."""

    def __init__(self, payload: str) -> None:
        try:
            decoded = json.loads(payload)
        except (ValueError, RecursionError):
            decoded = None
        # First four characters -> length -> the values (and whether each is a number): what a
        # quote starting with those four characters can be, each length one lookup.
        self._by_head: dict[str, dict[int, dict[str, bool]]] = {}
        # First four characters -> how many values start with them.
        self._counts: dict[str, int] = {}
        # The longest value's length: a text cut short must be masked with this much more of it,
        # or a value the cut splits keeps its first part unmasked.
        self.longest = 0
        for value, number in _quotable_values(decoded, sys.maxsize):
            head, size = value[:MIN_MASKED_CHARS], len(value)
            values = self._by_head.setdefault(head, {}).setdefault(size, {})
            if value not in values:
                self._counts[head] = self._counts.get(head, 0) + 1
            values[value] = number
            self.longest = max(self.longest, size)

    def mask(self, text: str) -> str:
        """``text`` with the payload's values it quotes masked, as :func:`mask_payload_values`."""
        if len(text) < MIN_MASKED_CHARS or not self._by_head:
            return text
        # One read of the text finds where a value could start: at its first four characters.
        # Most lines hold none (a few microseconds, and about 0.1 s for a megabyte).
        by_head = self._by_head
        hits = [
            at
            for at in range(len(text) - MIN_MASKED_CHARS + 1)
            if text[at : at + MIN_MASKED_CHARS] in by_head
        ]
        if not hits:
            return text
        starts: dict[str, list[int]] = {}
        for at in hits:
            starts.setdefault(text[at : at + MIN_MASKED_CHARS], []).append(at)
        spans: list[tuple[int, int]] = []
        for head, where in starts.items():
            by_size = by_head[head]
            # The cheaper way for this head: a lookup of the text at each of its starts for each
            # length its values have, or (a few values, a short text, or a head at every position
            # of a text such as "aaaa..." with values of a hundred lengths) a search for each value.
            if len(where) * len(by_size) * _CHARS_PER_LOOKUP <= self._counts[head] * len(text):
                _looked_up(text, where, by_size, spans)
            else:
                _searched(text, by_size, spans)
        if not spans:
            return text
        pieces: list[str] = []
        kept_from = 0  # the text before this is written (or masked) already
        for start, end in sorted(spans):
            if start >= kept_from:
                pieces += [text[kept_from:start], MASK]
            elif end <= kept_from:
                continue  # inside a span masked already
            kept_from = max(kept_from, end)
        pieces.append(text[kept_from:])
        return "".join(pieces)


# About how many characters str.find reads in the time of one slice of a text and a dict lookup of it.
_CHARS_PER_LOOKUP: Final = 256


def _looked_up(
    text: str, starts: list[int], by_size: Mapping[int, Mapping[str, bool]], spans: list[tuple[int, int]]
) -> None:
    """Add to ``spans`` the quotes of ``by_size``'s values at ``starts`` (in order), as
    :func:`_searched` finds them."""
    # Where each value found ends: a value is looked for past its last quote, not one character
    # on, as a search from there finds it (its quotes stay fewer than len(text) / its length,
    # however repetitive the text, and are the ones a search masks).
    found_to: dict[str, int] = {}
    for at in starts:
        for size, values in by_size.items():
            end = at + size
            value = text[at:end]
            number = values.get(value)
            if number is None or found_to.get(value, 0) > at:
                continue
            found_to[value] = end
            if not number or not (_digit_at(text, at - 1) or _digit_at(text, end)):
                spans.append((at, end))


def _searched(text: str, by_size: Mapping[int, Mapping[str, bool]], spans: list[tuple[int, int]]) -> None:
    """Add to ``spans`` the quotes in ``text`` of ``by_size``'s values, one search of it for each."""
    for values in by_size.values():
        for value, number in values.items():
            at = text.find(value)
            while at >= 0:
                end = at + len(value)
                if not number or not (_digit_at(text, at - 1) or _digit_at(text, end)):
                    spans.append((at, end))
                # Past this quote, not one character on: the spans of one value stay fewer than
                # len(text) / len(value), however repetitive the text.
                at = text.find(value, end)


def _quotable_values(decoded: object, longest: int) -> Iterator[tuple[str, bool]]:
    """The payload's strings and numbers as they would be quoted, with whether each is a number;
    only those of :data:`MIN_MASKED_CHARS` to ``longest`` characters."""
    pending = [decoded]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, str):
            if MIN_MASKED_CHARS <= len(value) <= longest:
                yield value, False
            if not value.isprintable() or not value.isascii() or any(c in value for c in "\\'\""):
                # Also as repr() and JSON write it: a KeyError, an OSError's file name or a dict in
                # an exception's text shows a value escaped (C:\\Users, line one\\nline two).
                escaped = {json.dumps(value, ensure_ascii=ascii)[1:-1] for ascii in (True, False)}
                for shown in (escaped | {repr(value)[1:-1]}) - {value}:
                    if MIN_MASKED_CHARS <= len(shown) <= longest:
                        yield shown, False
        elif isinstance(value, int | float) and not isinstance(value, bool):
            shown = repr(value)  # as JSON and Python write it (NaN and Infinity aside: words)
            if MIN_MASKED_CHARS <= len(shown) <= longest and shown[-1].isdigit():
                yield shown, True


def _digit_at(text: str, index: int) -> bool:
    return 0 <= index < len(text) and text[index].isdigit()


def redact_mapping(value: Mapping[K, object]) -> dict[K, object]:
    """A copy of ``value`` (recursively) with the values of sensitive keys masked and texts redacted."""
    return default_redactor().mapping(value)


# A few key names are enough to recognise a payload; all of them could be a long line.
_PAYLOAD_KEYS_SHOWN: Final = 10
_PAYLOAD_KEY_CHARS: Final = 40


def describe_payload(payload: object) -> str:
    """The shape of ``payload`` (type, top-level key names or length, size in bytes), never its values.

    A job's payload travels as JSON text, so a ``str`` or ``bytes`` holding a JSON object or array is
    described by what it decodes to:

    >>> describe_payload('{"url": "https://example.com", "retries": 3}')
    'JSON object with 2 keys [retries, url], 44 bytes'
    >>> describe_payload({"url": "https://example.com"})
    'dict with 1 key [url], 29 bytes'
    """
    if isinstance(payload, str | bytes | bytearray):
        raw = payload.encode() if isinstance(payload, str) else bytes(payload)
        decoded = _json_container(raw)
        if isinstance(decoded, dict):
            return f"JSON object with {_keys(decoded)}, {len(raw)} bytes"
        if isinstance(decoded, list):
            return f"JSON array with {_items(decoded)}, {len(raw)} bytes"
        return f"{type(payload).__name__}, {len(raw)} bytes"
    if payload is None:
        return "None"
    kind = type(payload).__name__
    try:
        # The JSON size stands for the size on the wire, where the payload is JSON text.
        size = f"{len(json.dumps(payload, separators=(',', ':'), default=str).encode())} bytes"
    except (TypeError, ValueError):
        size = "size unknown"
    if isinstance(payload, Mapping):
        return f"{kind} with {_keys(payload)}, {size}"
    if isinstance(payload, list | tuple):
        return f"{kind} with {_items(payload)}, {size}"
    return f"{kind}, {size}"


def _json_container(raw: bytes) -> object:
    # Only an object or an array has a shape worth telling; a scalar would be its own value.
    if raw.lstrip()[:1] not in (b"{", b"["):
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _keys(mapping: Mapping[object, object]) -> str:
    names = sorted(_key_name(key) for key in mapping)
    shown = ", ".join(names[:_PAYLOAD_KEYS_SHOWN])
    more = f", +{len(names) - _PAYLOAD_KEYS_SHOWN} more" if len(names) > _PAYLOAD_KEYS_SHOWN else ""
    return f"{len(names)} {'key' if len(names) == 1 else 'keys'} [{shown}{more}]"


def _items(items: list[object] | tuple[object, ...]) -> str:
    return f"{len(items)} {'item' if len(items) == 1 else 'items'}"


def _key_name(key: object) -> str:
    name = key if isinstance(key, str) else f"<{type(key).__name__}>"
    return name if len(name) <= _PAYLOAD_KEY_CHARS else name[: _PAYLOAD_KEY_CHARS - 1] + "…"
