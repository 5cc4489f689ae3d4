"""Whether PostgreSQL refused a connection for good (a wrong URL) or for now (an outage).

A component waits an outage out, however long; a URL that can never work is a setting to fix,
and waiting on it would hide the mistake behind a readiness probe that never turns green.
"""

from __future__ import annotations

import re

import psycopg

__all__ = ["REFUSED_FOR_GOOD", "first_line", "refused_for_good"]

# How libpq words a connection refused for good, a wrong URL rather than an outage, with the
# SQLSTATE the server sent: psycopg gives a failed connection none (libpq keeps the server's error
# to itself; psycopg/psycopg#1188), so its words are matched, in English as libpq and PostgreSQL
# write them. Any other failure is waited out, as an outage is: refused, timed out, the server
# starting up or shutting down (57P03), too many connections (53300), a host name no resolver
# knows (yet: a compose or Kubernetes service that is not up has none), a server that is not (yet)
# what target_session_attrs asks (a failover changes that), and a refusal worded in another
# language (the server's lc_messages).
REFUSED_FOR_GOOD = re.compile(
    "|".join(
        (
            r"authentication failed for user",  # 28P01 a wrong password; 28000 ident, peer, cert…
            r"fe_sendauth: no password supplied",  # the server asks for a password the URL lacks
            r"no pg_hba\.conf entry for",  # 28000
            r"pg_hba\.conf rejects connection",  # 28000
            r'role ".*" does not exist',  # 28000
            r'role ".*" is not permitted to log in',  # 28000
            r'database ".*" does not exist',  # 3D000
            r"permission denied for database",  # 42501: no CONNECT privilege
            r"^connection is bad: (invalid|could not match)",  # libpq refused the URL's parameters
            r"^could not match \d+ ",  # psycopg's own: host, hostaddr and port lists of other lengths
            r"server does not support SSL, but SSL was required",  # sslmode=require and up
            r"channel binding required, but",  # channel_binding=require
            r'authentication method requirement ".*" failed',  # require_auth
            r"unrecognized configuration parameter",  # 42704: the URL's options=-c…
            r'invalid value for parameter ".*"',  # 22023: the URL's options=-c…
        )
    )
)


def refused_for_good(error: BaseException) -> bool:
    """Whether PostgreSQL (or libpq) refused the connection for good: a wrong password, user or
    database name, parameters libpq rejects. psycopg raises the last address's failure first: that
    one decides."""
    return isinstance(error, psycopg.OperationalError) and bool(REFUSED_FOR_GOOD.search(first_line(error)))


def first_line(error: BaseException) -> str:
    """libpq's first line (it names host and port, never the password), or the error's class."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
