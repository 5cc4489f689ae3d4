"""KafkaConnection: the librdkafka keys each security protocol needs, and one line for a bad combination."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.kafka.connection import InvalidKafkaConnection, KafkaConnection
from scheduler.kafka.transport import consumer_config, producer_config

SECRETS = ("s3cret-sasl", "s3cret-key")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, {"bootstrap.servers": "b1:9092,b2:9092", "security.protocol": "plaintext"}),
        (
            {"security_protocol": "SSL", "ssl_ca_location": "/etc/kafka/ca.pem"},
            {
                "bootstrap.servers": "b1:9092,b2:9092",
                "security.protocol": "ssl",
                "ssl.ca.location": "/etc/kafka/ca.pem",
                "ssl.endpoint.identification.algorithm": "https",
            },
        ),
        (
            {
                "security_protocol": "SSL",
                "ssl_certificate_location": "/tls/client.pem",
                "ssl_key_location": "/tls/client.key",
                "ssl_key_password": "s3cret-key",
                "ssl_endpoint_identification": "none",
            },
            {
                "bootstrap.servers": "b1:9092,b2:9092",
                "security.protocol": "ssl",
                "ssl.certificate.location": "/tls/client.pem",
                "ssl.key.location": "/tls/client.key",
                "ssl.key.password": "s3cret-key",
                "ssl.endpoint.identification.algorithm": "none",
            },
        ),
        (
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "sasl_username": "alice",
                "sasl_password": "s3cret-sasl",
            },
            {
                "bootstrap.servers": "b1:9092,b2:9092",
                "security.protocol": "sasl_plaintext",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "alice",
                "sasl.password": "s3cret-sasl",
            },
        ),
        (
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_username": "alice",
                "sasl_password": "s3cret-sasl",
                "ssl_ca_location": "/etc/kafka/ca.pem",
            },
            {
                "bootstrap.servers": "b1:9092,b2:9092",
                "security.protocol": "sasl_ssl",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "alice",
                "sasl.password": "s3cret-sasl",
                "ssl.ca.location": "/etc/kafka/ca.pem",
                "ssl.endpoint.identification.algorithm": "https",
            },
        ),
    ],
    ids=["plaintext", "ssl-ca", "ssl-client-certificate", "sasl-plaintext", "sasl-ssl-scram"],
)
def test_each_protocol_renders_the_librdkafka_keys_it_needs(
    fields: dict[str, Any], expected: dict[str, str]
) -> None:
    connection = KafkaConnection("b1:9092,b2:9092", **fields)
    assert connection.librdkafka() == expected
    # Every client gets them: security is not something one caller can forget.
    assert producer_config(connection, "p").items() >= expected.items()
    assert consumer_config(connection, "g", "c").items() >= expected.items()
    for shown in (repr(connection), connection.describe()):
        assert not any(secret in shown for secret in SECRETS)


def test_the_description_says_how_it_authenticates() -> None:
    assert KafkaConnection("b:9092").describe() == "b:9092"
    connection = KafkaConnection(
        "b:9092",
        "SASL_SSL",
        "SCRAM-SHA-256",
        "alice",
        "s3cret-sasl",
        ssl_ca_location="/ca.pem",
        ssl_endpoint_identification="none",
    )
    assert connection.describe() == (
        "b:9092 (SASL SCRAM-SHA-256 as 'alice'; TLS, CA /ca.pem, host name not verified)"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"bootstrap": "localhost"}, "bootstrap='localhost' must be host:port"),
        ({"security_protocol": "TLS"}, "security_protocol='TLS' must be one of PLAINTEXT, SSL,"),
        ({"security_protocol": "SASL_SSL"}, "security_protocol=SASL_SSL needs sasl_mechanism"),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI", "sasl_username": "u"},
            "sasl_mechanism='GSSAPI' must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512",
        ),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_password": "s3cret-sasl"},
            "SASL PLAIN needs sasl_username",
        ),
        (
            {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": "u"},
            "SASL PLAIN needs sasl_password",
        ),
        (
            {"sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": "s3cret-sasl"},
            "sasl_mechanism is set but security_protocol=PLAINTEXT does not use SASL",
        ),
        (
            {"security_protocol": "SSL", "sasl_username": "u"},
            "sasl_username is set but security_protocol=SSL",
        ),
        (
            {"ssl_ca_location": "/ca.pem"},
            "ssl_ca_location is set but security_protocol=PLAINTEXT does not use TLS",
        ),
        (
            {"security_protocol": "SSL", "ssl_certificate_location": "/c.pem"},
            "ssl_certificate_location needs ssl_key_location",
        ),
        (
            {"security_protocol": "SSL", "ssl_key_location": "/c.key"},
            "ssl_key_location needs ssl_certificate_location",
        ),
        (
            {"security_protocol": "SSL", "ssl_key_password": "s3cret-key"},
            "ssl_key_password is set but ssl_key_location is not",
        ),
        (
            {"security_protocol": "SSL", "ssl_endpoint_identification": "strict"},
            "ssl_endpoint_identification='strict' must be https or none",
        ),
    ],
)
def test_a_bad_combination_is_one_line_without_secrets(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidKafkaConnection) as raised:
        KafkaConnection(**({"bootstrap": "b:9092"} | fields))
    text = str(raised.value)
    assert message in text and "\n" not in text
    assert not any(secret in text for secret in SECRETS)


def test_an_error_can_name_what_the_reader_set() -> None:
    with pytest.raises(InvalidKafkaConnection) as raised:
        KafkaConnection("b:9092", "SASL_SSL")
    variables = raised.value.naming(lambda name: f"KAFKA_{name.upper()}")
    assert (
        variables
        == "KAFKA_SECURITY_PROTOCOL=SASL_SSL needs KAFKA_SASL_MECHANISM (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)"
    )
