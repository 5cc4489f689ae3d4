"""Security settings: TLS for PostgreSQL and Kafka, SASL, secrets from files, and no secret ever shown."""

from __future__ import annotations

from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from scheduler.cli.common import database
from scheduler.config import ConfigError, load_settings, redact_url
from scheduler.kafka.connection import KafkaConnection
from scheduler.wiring import Wiring

PASSWORD = "hunter2-secret"


@pytest.fixture
def certs(tmp_path: Path) -> dict[str, str]:
    files = {}
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text("not really PEM\n")
        files[name] = str(tmp_path / name)
    return files


def test_a_plain_url_is_used_exactly_as_given() -> None:
    url = "postgresql://scheduler@db.internal:5432/scheduler"
    assert load_settings({"SCHEDULER_DATABASE_URL": url}).database_url == url
    with_query = f"postgresql://app:{PASSWORD}@db:5432/s?sslmode=verify-full&sslrootcert=/ca.pem"
    assert load_settings({"SCHEDULER_DATABASE_URL": with_query}).database_url == with_query
    # Escaped reserved characters, several hosts, an '@' in the query, a socket folder: all taken.
    for url in (
        "postgresql://app:S3c%2Fret%40PW@db:5432/s",
        "postgresql://app:pw@h1:5432,h2:5433/s?target_session_attrs=read-write",
        "postgresql://app@db/s?application_name=me@host",
        "postgresql:///s?host=/var/run/postgresql",
        "postgresql://app@db/my@db",  # an '@' in the database name, after a user
        "postgresql://app:p%23x@[::1]:5432/s",
    ):
        assert load_settings({"SCHEDULER_DATABASE_URL": url}).database_url == url


def test_tls_variables_and_the_password_are_merged_into_the_connection_string(certs: dict[str, str]) -> None:
    settings = load_settings(
        {
            "SCHEDULER_DATABASE_URL": "postgresql://app@db:5432/scheduler?application_name=x",
            "SCHEDULER_DATABASE_SSLMODE": "verify-full",
            "SCHEDULER_DATABASE_SSLROOTCERT": certs["ca.pem"],
            "SCHEDULER_DATABASE_SSLCERT": certs["client.pem"],
            "SCHEDULER_DATABASE_SSLKEY": certs["client.key"],
            "SCHEDULER_DATABASE_PASSWORD": PASSWORD,
        }
    )
    assert conninfo_to_dict(settings.database_url) == {
        "user": "app",
        "host": "db",
        "port": "5432",
        "dbname": "scheduler",
        "application_name": "x",
        "sslmode": "verify-full",
        "sslrootcert": certs["ca.pem"],
        "sslcert": certs["client.pem"],
        "sslkey": certs["client.key"],
        "password": PASSWORD,
    }
    # The merged string is itself a valid SCHEDULER_DATABASE_URL (subprocesses are handed it).
    again = load_settings({"SCHEDULER_DATABASE_URL": settings.database_url})
    assert conninfo_to_dict(again.database_url) == conninfo_to_dict(settings.database_url)
    assert settings.database_display == "postgresql://app@db:5432/scheduler"


def test_variables_win_over_the_url_query() -> None:
    settings = load_settings(
        {
            "SCHEDULER_DATABASE_URL": "postgresql://db/s?sslmode=require",
            "SCHEDULER_DATABASE_SSLMODE": "disable",
        }
    )
    assert conninfo_to_dict(settings.database_url)["sslmode"] == "disable"


def test_passwords_are_read_from_files_without_their_newline(tmp_path: Path) -> None:
    (tmp_path / "pg").write_text(f"{PASSWORD}\n")
    (tmp_path / "sasl").write_text("sasl-from-file\r\n")
    settings = load_settings(
        {
            "SCHEDULER_DATABASE_PASSWORD_FILE": str(tmp_path / "pg"),
            "SCHEDULER_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext",
            "SCHEDULER_KAFKA_SASL_MECHANISM": "scram-sha-256",
            "SCHEDULER_KAFKA_SASL_USERNAME": "svc",
            "SCHEDULER_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "sasl"),
        }
    )
    assert conninfo_to_dict(settings.database_url)["password"] == PASSWORD
    assert settings.kafka == KafkaConnection(
        "127.0.0.1:19092", "SASL_PLAINTEXT", "SCRAM-SHA-256", "svc", "sasl-from-file"
    )


def test_kafka_tls_settings_become_the_connection(certs: dict[str, str]) -> None:
    settings = load_settings(
        {
            "SCHEDULER_KAFKA_BOOTSTRAP": "k1:9093,k2:9093",
            "SCHEDULER_KAFKA_SECURITY_PROTOCOL": "SSL",
            "SCHEDULER_KAFKA_SSL_CA_LOCATION": certs["ca.pem"],
            "SCHEDULER_KAFKA_SSL_CERTIFICATE_LOCATION": certs["client.pem"],
            "SCHEDULER_KAFKA_SSL_KEY_LOCATION": certs["client.key"],
            "SCHEDULER_KAFKA_SSL_KEY_PASSWORD": PASSWORD,
        }
    )
    assert settings.kafka_bootstrap == "k1:9093,k2:9093"
    assert settings.kafka.librdkafka()["ssl.key.password"] == PASSWORD
    assert settings.kafka.librdkafka()["ssl.ca.location"] == certs["ca.pem"]


def test_settings_repr_shows_no_secret(tmp_path: Path, certs: dict[str, str]) -> None:
    settings = load_settings(
        {
            "SCHEDULER_DATABASE_URL": f"postgresql://app:{PASSWORD}@db/s?sslmode=require&password={PASSWORD}",
            "SCHEDULER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "SCHEDULER_KAFKA_SASL_MECHANISM": "PLAIN",
            "SCHEDULER_KAFKA_SASL_USERNAME": "svc",
            "SCHEDULER_KAFKA_SASL_PASSWORD": PASSWORD,
            "SCHEDULER_KAFKA_SSL_CERTIFICATE_LOCATION": certs["client.pem"],
            "SCHEDULER_KAFKA_SSL_KEY_LOCATION": certs["client.key"],
            "SCHEDULER_KAFKA_SSL_KEY_PASSWORD": PASSWORD,
        }
    )
    for shown in (repr(settings), str(settings), settings.database_display, settings.kafka.describe()):
        assert PASSWORD not in shown
    assert "database_url='postgresql://app@db/s'" in repr(settings)


@pytest.mark.parametrize(
    ("conninfo", "shown"),
    [
        (f"postgresql://app:{PASSWORD}@db:5432/sched?sslmode=require", "postgresql://app@db:5432/sched"),
        (f"postgres://app:{PASSWORD}@h1:5432,h2:5433/sched", "postgresql://app@h1:5432,h2:5433/sched"),
        (f"host=db port=5432 dbname=sched user=app password={PASSWORD}", "postgresql://app@db:5432/sched"),
        (f"postgresql://:{PASSWORD}@db/sched", "postgresql://db/sched"),
        (f"postgresql://app:{PASSWORD}@db/sched?bogus=1", "postgresql://(unparseable connection string)"),
    ],
)
def test_the_displayed_url_drops_the_password_and_the_parameters(conninfo: str, shown: str) -> None:
    assert redact_url(conninfo) == shown


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SCHEDULER_DATABASE_URL": f"mysql://app:{PASSWORD}@db/s"}, "must be a postgresql:// URL"),
        (
            {"SCHEDULER_DATABASE_URL": f"postgresql://app:{PASSWORD}@db/s?bogus=1"},
            "is not a valid PostgreSQL",
        ),
        (
            {"SCHEDULER_DATABASE_URL": f"postgresql://app:{PASSWORD}@db/s?sslmode=on"},
            "SCHEDULER_DATABASE_URL has sslmode='on'; it must be one of disable, allow, prefer, require,",
        ),
        # An unescaped '/' or '@' in the password: libpq reads the rest as the host or the database.
        *(
            (
                {"SCHEDULER_DATABASE_URL": f"postgresql://app:{password}@db:5432/s"},
                "SCHEDULER_DATABASE_URL has an '@' or '/' in its user name or password: percent-encode",
            )
            for password in (
                f"S3c/{PASSWORD}",
                f"S3c@{PASSWORD}",
                f"{PASSWORD}/x",
                f"a/b@{PASSWORD}",
                f"p?a@{PASSWORD}",
            )
        ),
        ({"SCHEDULER_DATABASE_SSLMODE": "strict"}, "SCHEDULER_DATABASE_SSLMODE='strict' must be one of"),
        (
            {"SCHEDULER_DATABASE_SSLROOTCERT": "/nonexistent/ca.pem"},
            "SCHEDULER_DATABASE_SSLROOTCERT='/nonexistent/ca.pem' is not a readable file",
        ),
        (
            {"SCHEDULER_DATABASE_PASSWORD": PASSWORD, "SCHEDULER_DATABASE_PASSWORD_FILE": "/x"},
            "set SCHEDULER_DATABASE_PASSWORD or SCHEDULER_DATABASE_PASSWORD_FILE, not both",
        ),
        (
            {"SCHEDULER_DATABASE_PASSWORD_FILE": "/nonexistent/pw"},
            "SCHEDULER_DATABASE_PASSWORD_FILE='/nonexistent/pw' cannot be read",
        ),
        (
            {"SCHEDULER_KAFKA_SECURITY_PROTOCOL": "TLS"},
            "SCHEDULER_KAFKA_SECURITY_PROTOCOL='TLS' must be one of",
        ),
        (
            {"SCHEDULER_KAFKA_SASL_MECHANISM": "PLAIN", "SCHEDULER_KAFKA_SASL_PASSWORD": PASSWORD},
            "SCHEDULER_KAFKA_SASL_MECHANISM is set but SCHEDULER_KAFKA_SECURITY_PROTOCOL=PLAINTEXT does not",
        ),
        (
            {
                "SCHEDULER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "SCHEDULER_KAFKA_SASL_MECHANISM": "PLAIN",
                "SCHEDULER_KAFKA_SASL_PASSWORD": PASSWORD,
            },
            "SASL PLAIN needs SCHEDULER_KAFKA_SASL_USERNAME",
        ),
        (
            {"SCHEDULER_KAFKA_SECURITY_PROTOCOL": "SSL", "SCHEDULER_KAFKA_SSL_KEY_PASSWORD": PASSWORD},
            "SCHEDULER_KAFKA_SSL_KEY_PASSWORD is set but SCHEDULER_KAFKA_SSL_KEY_LOCATION is not",
        ),
        (
            {"SCHEDULER_KAFKA_SECURITY_PROTOCOL": "SSL", "SCHEDULER_KAFKA_SSL_CA_LOCATION": "/nonexistent"},
            "SCHEDULER_KAFKA_SSL_CA_LOCATION='/nonexistent' is not a readable file",
        ),
    ],
)
def test_a_bad_security_setting_is_one_line_naming_its_variable_and_no_secret(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(env)
    text = str(raised.value)
    assert message in text and "\n" not in text
    assert PASSWORD not in text


def test_the_cli_line_for_an_unreachable_database_shows_no_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Port 1 on the loopback refuses at once: the failure is ours to report, not a timeout.
    settings = load_settings({"SCHEDULER_DATABASE_URL": f"postgresql://app:{PASSWORD}@127.0.0.1:1/sched"})
    with pytest.raises(SystemExit), database(Wiring(settings)):
        pass
    err = capsys.readouterr().err
    assert "cannot reach PostgreSQL at postgresql://app@127.0.0.1:1/sched" in err
    assert PASSWORD not in err
