"""Redaction: what an operator reading a log line or a stored error text must never see."""

from __future__ import annotations

import json

import pytest

from scheduler.telemetry import redact
from scheduler.telemetry.redact import (
    DEFAULT_SENSITIVE_KEYS,
    MASK,
    Redactor,
    describe_payload,
    mask_payload_values,
    redact_mapping,
    redact_text,
)


@pytest.fixture(autouse=True)
def default_patterns() -> None:
    # Another test (or configure_logging) may have installed a redactor with more patterns.
    redact.install(Redactor())


def test_a_postgresql_url_keeps_the_user_and_loses_the_password() -> None:
    text = "cannot connect to postgresql://app:hunter2@db.internal:5432/sched: timeout"
    assert redact_text(text) == f"cannot connect to postgresql://app:{MASK}@db.internal:5432/sched: timeout"


def test_a_password_with_an_at_sign_is_masked_whole() -> None:
    assert redact_text("postgresql://app:p@ss@db/sched") == f"postgresql://app:{MASK}@db/sched"


def test_a_role_without_password_is_kept_but_a_lone_token_elsewhere_is_not() -> None:
    assert redact_text("postgresql://scheduler@127.0.0.1:54329/scheduler").startswith(
        "postgresql://scheduler@127.0.0.1"
    )
    assert redact_text("clone https://ghp_abc123@github.com/org/repo.git") == (
        f"clone https://{MASK}@github.com/org/repo.git"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "GET https://api.example.com/v1/items?token=abc&page=2 returned 500",
            f"GET https://api.example.com/v1/items?token={MASK}&page={MASK} returned 500",
        ),
        ("redis://cache:6379/0?password=pw", f"redis://cache:6379/0?password={MASK}"),
        ("https://idp.example.com/cb#access_token=xyz", f"https://idp.example.com/cb#{MASK}"),
        (
            "postgresql://app:pw@db/sched?sslmode=require",
            f"postgresql://app:{MASK}@db/sched?sslmode={MASK}",
        ),
    ],
)
def test_query_strings_and_fragments_lose_their_values_for_any_scheme(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "SASL authentication failed: sasl.password=hunter2 sasl.mechanism=PLAIN",
        "config {'bootstrap.servers': 'b:9092', 'sasl.password': 'hunter2'}",
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required"
        ' username="app" password="hunter2";',
    ],
)
def test_a_kafka_sasl_password_in_a_message_is_masked(text: str) -> None:
    out = redact_text(text)
    assert "hunter2" not in out
    assert MASK in out


def test_a_kafka_listener_url_is_not_taken_for_a_sasl_key() -> None:
    assert redact_text("bootstrap SASL_SSL://broker-1:9092 down") == "bootstrap SASL_SSL://broker-1:9092 down"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer eyJhbGciOi.abc-def_ghi", f"Authorization: Bearer {MASK}"),
        ("authorization=Basic dXNlcjpwYXNz", f"authorization=Basic {MASK}"),
        ("retrying with bearer abc.def/ghi== after 401", f"retrying with bearer {MASK} after 401"),
    ],
)
def test_auth_header_credentials_are_masked_and_the_scheme_kept(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_sensitive_keys_in_json_and_key_value_text_are_masked_and_others_kept() -> None:
    text = '{"user": "u", "password": "x\\"y z", "API_KEY": "k1", "nested": {"token": "t"}}'
    assert json.loads(redact_text(text)) == {
        "user": "u",
        "password": MASK,
        "API_KEY": MASK,
        "nested": {"token": MASK},
    }
    assert redact_text("host=db user=app password=s3cr3t dbname=sched") == (
        f"host=db user=app password={MASK} dbname=sched"
    )


def test_ordinary_text_is_unchanged() -> None:
    for text in (
        "run 68e157b7-aac1-4d89-be02-9d8542db268a succeeded in 0.012s",
        "error: connection refused; token expired: retrying at 12:30:45",
        "Basic checks passed, digest: ok",
        "",
    ):
        assert redact_text(text) == text


def test_redaction_is_idempotent() -> None:
    text = "Authorization: Bearer abc postgresql://u:p@h/d?x=1 token=t"
    once = redact_text(text)
    assert redact_text(once) == once


def test_a_nested_mapping_masks_sensitive_keys_at_any_depth_and_redacts_other_texts() -> None:
    value: dict[str, object] = {
        "handler": "builtin:http",
        "options": {"api_key": "k-123", "Session-Id": "s", "retries": 3, "password": None},
        "targets": [{"url": "https://u:pw@example.com/x"}, {"client_secret": {"a": 1}}],
        "credentials": {"user": "u", "pass": "p"},
    }
    assert redact_mapping(value) == {
        "handler": "builtin:http",
        "options": {"api_key": MASK, "Session-Id": MASK, "retries": 3, "password": None},
        "targets": [{"url": f"https://u:{MASK}@example.com/x"}, {"client_secret": MASK}],
        "credentials": MASK,
    }
    assert value["options"] == {"api_key": "k-123", "Session-Id": "s", "retries": 3, "password": None}


def test_every_default_pattern_is_masked_in_mappings_and_in_text() -> None:
    samples = ["password", "passwd", "secret", "token", "authorization", "apikey", "api-key", "API_KEY"]
    samples += ["credential", "cookie", "session", "private_key", "privatekey", "sasl_password"]
    assert len(DEFAULT_SENSITIVE_KEYS) == 11
    for key in samples:
        assert redact_mapping({key: "v"}) == {key: MASK}, key
        assert redact_text(f"{key}=v1") == f"{key}={MASK}", key


def test_a_cyclic_structure_ends() -> None:
    value: dict[str, object] = {"a": 1}
    value["self"] = value
    out = redact_mapping(value)
    assert out["a"] == 1


def test_configured_patterns_add_to_the_defaults() -> None:
    redactor = Redactor.from_env({"SCHEDULER_REDACT_KEYS": r" ^ssn$ , iban , "})
    assert redactor.mapping({"ssn": "1", "SSN": "2", "ssn_kind": "3", "iban": "4", "token": "5"}) == {
        "ssn": MASK,
        "SSN": MASK,
        "ssn_kind": "3",
        "iban": MASK,
        "token": MASK,
    }
    assert redactor.text("customer iban=DE89370400440532013000") == f"customer iban={MASK}"


def test_a_bad_configured_pattern_is_one_line_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="SCHEDULER_REDACT_KEYS") as caught:
        Redactor.from_env({"SCHEDULER_REDACT_KEYS": "ok,bad[pattern"})
    assert "\n" not in str(caught.value)
    assert "bad[pattern" in str(caught.value)


def test_a_payload_is_described_by_its_shape_never_its_values() -> None:
    payload = {"url": "https://example.com/hook", "secret_number": 424242, "retries": 3}
    text = json.dumps(payload)
    for described in (describe_payload(payload), describe_payload(text), describe_payload(text.encode())):
        assert "3 keys [retries, secret_number, url]" in described
        assert "example.com" not in described and "424242" not in described
    assert (
        describe_payload(text) == f"JSON object with 3 keys [retries, secret_number, url], {len(text)} bytes"
    )
    assert describe_payload("[1, 2]") == "JSON array with 2 items, 6 bytes"
    assert describe_payload("not json: hunter2") == "str, 17 bytes"
    assert describe_payload([1, 2, 3]) == "list with 3 items, 7 bytes"
    assert describe_payload(None) == "None"


def test_a_payload_with_many_keys_names_only_the_first() -> None:
    described = describe_payload({f"k{i:02d}": i for i in range(25)})
    assert described.startswith("dict with 25 keys [k00, k01,")
    assert "+15 more" in described
    assert "k24" not in described


@pytest.mark.parametrize(
    ("text", "payload", "masked"),
    [
        ("card 4111-1111 declined", '{"card": "4111-1111"}', "card *** declined"),
        ("nested 4111-1111 and 12345.5", '{"a": [{"b": "4111-1111"}], "n": 12345.5}', "nested *** and ***"),
        ("longest first: abcdef", '{"x": "abcd", "y": "abcdef"}', "longest first: ***"),
        (
            "short values stay: ok 42 abc",
            '{"a": "ok", "b": 42, "c": "abc", "d": true}',
            "short values stay: ok 42 abc",
        ),
        ("a plain string payload: secret stuff", '"secret stuff"', "a plain string payload: ***"),
        ("regex characters are literal: a.b*c", '{"p": "a.b*c"}', "regex characters are literal: ***"),
        ("not JSON: nothing to mask", "{not json", "not JSON: nothing to mask"),
        (
            "overlapping quotes: abcdSECRETTAIL",
            '{"a": "abcd", "b": "bcdSECRETTAIL"}',
            "overlapping quotes: ***",
        ),
        (
            "overlapping the other way: SECRETabcXYZW",
            '{"a": "SECRETabc", "b": "abcXYZW"}',
            "overlapping the other way: ***",
        ),
        ("numbers stand alone: 10000 ms, 1000 ms", '{"n": 1000}', "numbers stand alone: 10000 ms, *** ms"),
        (
            "many short values first: 4111-1111",
            json.dumps({"ids": list(range(5000)), "card": "4111-1111"}),
            "many short values first: ***",
        ),
        ("", '{"a": "abcd"}', ""),
        # Escaped as repr() and JSON show them: an OSError's file name, a KeyError, a dict.
        (
            str(OSError(2, "No such file or directory", "C:\\Users\\alice\\salary.xlsx")),
            json.dumps({"path": "C:\\Users\\alice\\salary.xlsx"}),
            "[Errno 2] No such file or directory: '***'",
        ),
        (str(KeyError("line one\nline two")), json.dumps({"note": "line one\nline two"}), "'***'"),
        (
            str(ValueError({"note": "line one\nline two", "who": "Zoë Ünal"})),
            json.dumps({"note": "line one\nline two", "who": "Zoë Ünal"}),
            "{'note': '***', 'who': '***'}",
        ),
        ('bad: {"who": "Zo\\u00eb \\u00dcnal"}', json.dumps({"who": "Zoë Ünal"}), 'bad: {"who": "***"}'),
    ],
)
def test_a_handler_error_quoting_its_payload_has_those_values_masked(
    text: str, payload: str, masked: str
) -> None:
    assert mask_payload_values(text, payload) == masked


def test_the_row_postgresql_quotes_in_a_refusal_is_masked_to_the_end_of_the_text() -> None:
    """A failed insert's text quotes the whole row, payload values too; a text column of the row
    may hold a line break, so everything after the row's start goes."""
    text = (
        'new row for relation "schedules" violates check constraint "schedules_cron_check"\n'
        'DETAIL:  Failing row contains (8d1e, billing, a name\nover two lines, {"card": "4111-1111"}).'
    )
    redacted = redact_text(text)
    assert "4111" not in redacted and "billing" not in redacted
    assert redacted.startswith('new row for relation "schedules" violates check constraint')
    assert redacted.endswith("Failing row contains (***)")


def test_a_path_without_a_scheme_has_its_query_values_masked() -> None:
    """How HTTP clients word a request they retry (urllib3, under the OTLP exporter): the
    collector's URL without its scheme, its signature in the query."""
    text = "Max retries exceeded with url: /v1/traces?sig=sv2026sigQ7zXk4&code=fnkey (Caused by refused)"
    assert redact_text(text) == (
        f"Max retries exceeded with url: /v1/traces?sig={MASK}&code={MASK} (Caused by refused)"
    )
    assert redact_text("127.0.0.1:4318/v1/traces?sig=abc") == f"127.0.0.1:4318/v1/traces?sig={MASK}"
    assert redact_text("a ratio of 1/2? no query") == "a ratio of 1/2? no query"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("(url: /v1/traces?sig=abc)", f"(url: /v1/traces?sig={MASK})"),
        (
            "failed: https://collector:4318/v1/traces?sig=abc.",
            f"failed: https://collector:4318/v1/traces?sig={MASK}.",
        ),
        ("(https://h/p?a=1&b=2), then", f"(https://h/p?a={MASK}&b={MASK}), then"),
        ("at /p?k=v);", f"at /p?k={MASK});"),
        # Punctuation inside a value is the value's: masked with it.
        ("/p?k=a)b c", f"/p?k={MASK} c"),
    ],
)
def test_the_punctuation_that_ends_a_query_stays_outside_the_mask(text: str, masked: str) -> None:
    assert redact_text(text) == masked


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("failed: https://h/p?sig=!!!", f"failed: https://h/p?sig={MASK}"),
        ("failed: /p?code=.,:!", f"failed: /p?code={MASK}"),
        # ";" separates parameters as "&" does: ":!" is a name without a value, shown as names are.
        ("failed: /p?code=.;:!", f"failed: /p?code={MASK};:!"),
    ],
)
def test_a_query_value_of_punctuation_alone_is_masked_not_shown(text: str, masked: str) -> None:
    # The punctuation that ends a query is left outside the mask as the text's own; a value made of
    # nothing else is then shown whole, after a mask that hides nothing ("sig=***!!!").
    assert redact_text(text) == masked
