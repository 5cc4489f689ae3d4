"""Where the Kafka cluster is and how to authenticate to it, independent of any client library.

One :class:`KafkaConnection` describes the cluster for every client a component builds (producers,
consumers, admin), so TLS and SASL apply to all of them or to none. It renders librdkafka's keys
with :meth:`KafkaConnection.librdkafka` and a loggable summary with :meth:`KafkaConnection.describe`;
the passwords appear in neither its repr nor its summary nor its errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, get_args

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
# OAUTHBEARER and GSSAPI need token providers or Kerberos tickets of their own: not supported.
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
EndpointIdentification = Literal["https", "none"]

SECURITY_PROTOCOLS: tuple[str, ...] = get_args(SecurityProtocol)
SASL_MECHANISMS: tuple[str, ...] = get_args(SaslMechanism)
ENDPOINT_IDENTIFICATIONS: tuple[str, ...] = get_args(EndpointIdentification)

Naming = Callable[[str], str]
"""Turns a field name into what the reader of an error knows it by (an environment variable)."""


@dataclass(frozen=True)
class _Field:
    name: str


class InvalidKafkaConnection(ValueError):
    """A combination of settings no client could connect with; ``str()`` is one line.

    The message names fields; :meth:`naming` renders it again with the names the reader set them by.
    """

    def __init__(self, *parts: str | _Field) -> None:
        self._parts = parts
        super().__init__(self.naming(lambda name: name))

    def naming(self, name: Naming) -> str:
        return "".join(name(p.name) if isinstance(p, _Field) else p for p in self._parts)


@dataclass(frozen=True)
class KafkaConnection:
    bootstrap: str
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    ssl_endpoint_identification: EndpointIdentification = "https"

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def librdkafka(self) -> dict[str, str]:
        """The librdkafka configuration keys for this connection (secrets included: a client's own)."""
        config = {"bootstrap.servers": self.bootstrap, "security.protocol": self.security_protocol.lower()}
        if self.uses_sasl:
            assert self.sasl_mechanism and self.sasl_username and self.sasl_password  # validated
            config |= {
                "sasl.mechanism": self.sasl_mechanism,
                "sasl.username": self.sasl_username,
                "sasl.password": self.sasl_password,
            }
        if self.uses_tls:
            config["ssl.endpoint.identification.algorithm"] = self.ssl_endpoint_identification
            optional = {
                "ssl.ca.location": self.ssl_ca_location,
                "ssl.certificate.location": self.ssl_certificate_location,
                "ssl.key.location": self.ssl_key_location,
                "ssl.key.password": self.ssl_key_password,
            }
            config |= {key: value for key, value in optional.items() if value is not None}
        return config

    def describe(self) -> str:
        """One line for logs and errors: where, and how it authenticates; never a secret."""
        parts = []
        if self.uses_sasl:
            parts.append(f"SASL {self.sasl_mechanism} as {self.sasl_username!r}")
        if self.uses_tls:
            tls = "TLS"
            if self.ssl_ca_location:
                tls += f", CA {self.ssl_ca_location}"
            if self.ssl_certificate_location:
                tls += f", client certificate {self.ssl_certificate_location}"
            if self.ssl_endpoint_identification == "none":
                tls += ", host name not verified"
            parts.append(tls)
        return self.bootstrap + (f" ({'; '.join(parts)})" if parts else "")


def _validate(c: KafkaConnection) -> None:
    protocol = _Field("security_protocol")
    for server in c.bootstrap.split(","):
        host, sep, port = server.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise InvalidKafkaConnection(
                _Field("bootstrap"), f"={c.bootstrap!r} must be host:port[,host:port...]"
            )
    if c.security_protocol not in SECURITY_PROTOCOLS:
        raise InvalidKafkaConnection(
            protocol, f"={c.security_protocol!r} must be one of {', '.join(SECURITY_PROTOCOLS)}"
        )
    if c.ssl_endpoint_identification not in ENDPOINT_IDENTIFICATIONS:
        raise InvalidKafkaConnection(
            _Field("ssl_endpoint_identification"),
            f"={c.ssl_endpoint_identification!r} must be https or none",
        )
    if c.uses_sasl:
        if c.sasl_mechanism is None:
            raise InvalidKafkaConnection(
                protocol,
                f"={c.security_protocol} needs ",
                _Field("sasl_mechanism"),
                f" ({', '.join(SASL_MECHANISMS)})",
            )
        if c.sasl_mechanism not in SASL_MECHANISMS:
            raise InvalidKafkaConnection(
                _Field("sasl_mechanism"),
                f"={c.sasl_mechanism!r} must be one of {', '.join(SASL_MECHANISMS)}",
            )
        for name in ("sasl_username", "sasl_password"):
            if not getattr(c, name):
                raise InvalidKafkaConnection(f"SASL {c.sasl_mechanism} needs ", _Field(name))
    else:
        for name in ("sasl_mechanism", "sasl_username", "sasl_password"):
            if getattr(c, name) is not None:
                raise InvalidKafkaConnection(
                    _Field(name),
                    " is set but ",
                    protocol,
                    f"={c.security_protocol} does not use SASL (SASL_PLAINTEXT or SASL_SSL does)",
                )
    if not c.uses_tls:
        for name in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location", "ssl_key_password"):
            if getattr(c, name) is not None:
                raise InvalidKafkaConnection(
                    _Field(name),
                    " is set but ",
                    protocol,
                    f"={c.security_protocol} does not use TLS (SSL or SASL_SSL does)",
                )
    if c.ssl_certificate_location is not None and c.ssl_key_location is None:
        raise InvalidKafkaConnection(
            _Field("ssl_certificate_location"), " needs ", _Field("ssl_key_location"), " (its private key)"
        )
    if c.ssl_key_location is not None and c.ssl_certificate_location is None:
        raise InvalidKafkaConnection(
            _Field("ssl_key_location"), " needs ", _Field("ssl_certificate_location"), " (its certificate)"
        )
    if c.ssl_key_password is not None and c.ssl_key_location is None:
        raise InvalidKafkaConnection(
            _Field("ssl_key_password"), " is set but ", _Field("ssl_key_location"), " is not"
        )
