"""libpq parameters in ``postgresql://`` URLs, turned into what asyncpg takes.

Managed providers hand out libpq connection strings (``?sslmode=require`` and friends).
SQLAlchemy's asyncpg dialect passes every query parameter to ``asyncpg.connect()`` as a
keyword, where all of them but a few are a ``TypeError``. Here the supported ones are
checked when ``connect()`` is called (``normalize``) and, when the engine is made, taken
out of the URL and handed to asyncpg the way it understands them (``split``):

* ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``, ``sslpassword``: asyncpg reads
  these only from a connection string, where it implements libpq's six modes and
  defaults itself (``~/.postgresql/root.crt``, ``postgresql.crt``/``.key``, the
  ``PGSSL*`` variables). They go to it as ``dsn``, a connection string holding nothing
  else: asyncpg's documented rule is that the keyword arguments SQLAlchemy also passes
  (host, port, user, password, database) override it.
* ``connect_timeout``: seconds (libpq: 0 waits forever, 1 means 2) -> ``timeout``.
* ``application_name`` and ``options`` are startup parameters -> ``server_settings``;
  ``options`` is sent verbatim, as libpq sends it, and the server parses it
  (``-c name=value``, ``--name=value``; provider-specific values such as Neon's
  ``endpoint=...`` pass through untouched).
* ``target_session_attrs`` -> the keyword of the same name.
* ``password`` moves into the URL's password, where SQLAlchemy hides it.

libpq's multi-host form, ``postgresql://h1:p1,h2:p2/db`` (what providers hand out for a
primary and its standbys), is rewritten by ``multi_host`` into SQLAlchemy's
``?host=h1:p1&host=h2:p2`` before the URL is parsed; asyncpg then tries the hosts in
order, keeping the first that ``target_session_attrs`` accepts.

``pool_size``, ``max_overflow`` and ``refused_wait`` are histstore's own
(``_storage.pool_options``): checked here, taken out of the URL before the driver.

``host`` (SQLAlchemy's multi-host and socket-directory form) and
``prepared_statement_cache_size`` (SQLAlchemy's asyncpg setting) are SQLAlchemy's own and
stay in the URL. ``command_timeout`` is histstore's own (``connect()`` takes it out of
the URL; ``split`` drops it). Anything else is a ``ValueError`` naming it. SQLite URLs
are not touched.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import URL

from .pool_options import URL_PARAMS, pool_options

__all__ = ["SUPPORTED", "display", "multi_host", "normalize", "split"]

SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
SESSION_ATTRS = ("any", "read-write", "read-only", "primary", "standby", "prefer-standby")
_TLS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword")
_LIBPQ = (*_TLS, "connect_timeout", "application_name", "options", "target_session_attrs")
_SQLALCHEMY = ("host", "prepared_statement_cache_size")
_STORE = ("command_timeout",)  # histstore's own (``_storage.deadlines``), not asyncpg's
SUPPORTED = (*_LIBPQ, "password", *_SQLALCHEMY, *URL_PARAMS, *_STORE)
"""Every query parameter a ``postgresql://`` URL may carry."""
_SECRET = ("sslpassword",)
_HIDDEN = "***"


DEFAULT_PORT = 5432
"""libpq's port for a host of a list that names none."""
_NETLOC = re.compile(
    r"^(?P<scheme>postgres(?:ql)?(?:\+\w+)?://)(?P<auth>[^@/?#]*@)?(?P<hosts>[^/?#]*)(?P<rest>.*)$",
    re.S,
)


def multi_host(target: str) -> str:
    """A ``postgresql://`` URL whose host part lists several hosts, libpq's way
    (``h1:p1,h2:p2``; a host without a port gets 5432), in SQLAlchemy's form
    (``?host=h1:p1&host=h2:p2``, after the URL's own query); any other text as it is.

    Raises:
        ValueError: an empty host in the list, a port that is not a number, an IPv6
            address in a list (give those with ``?host=``) or hosts given both ways.
    """
    match = _NETLOC.match(target)
    if match is None or "," not in match["hosts"]:
        return target
    hosts: list[str] = []
    for part in match["hosts"].split(","):
        host, colon, port = part.partition(":")
        if part.startswith("[") or ":" in port:
            raise ValueError("an IPv6 address in a multi-host URL: give each host as ?host=")
        if not host:
            raise ValueError("a multi-host URL names an empty host")
        if colon and not port.isdigit():
            raise ValueError(f"the port of host {host!r} must be a number, not {port!r}")
        hosts.append(f"{host}:{port if colon else DEFAULT_PORT}")
    path, _, query = match["rest"].partition("?")
    if re.search(r"(?:^|&)host=", query):
        raise ValueError("a URL gives its hosts either before the path or as ?host=, not both")
    listed = "&".join(f"host={host}" for host in hosts)
    return f"{match['scheme']}{match['auth'] or ''}{path}?{query + '&' if query else ''}{listed}"


def _is_postgres(url: URL) -> bool:
    return url.get_backend_name() == "postgresql"


def _one(url: URL, name: str) -> str:
    value = url.query[name]
    if not isinstance(value, str):
        raise ValueError(f"the URL parameter {name!r} is given more than once")
    return value


def normalize(url: URL) -> URL:
    """Check a PostgreSQL URL's query parameters; move ``?password=`` into the URL.

    Other URLs are returned as they are.

    Raises:
        ValueError: a parameter histstore does not support, or a bad value (the message
            names the parameter, never a password).
    """
    if not _is_postgres(url):
        return url
    unknown = sorted(set(url.query) - set(SUPPORTED))
    if unknown:
        raise ValueError(
            f"unsupported parameter {unknown[0]!r} in the database URL; a postgresql://"
            f" URL may carry: {', '.join(SUPPORTED)}"
        )
    for name in url.query:
        if name != "host":  # SQLAlchemy's multi-host form repeats it
            _one(url, name)
    query = url.query
    if "sslmode" in query and query["sslmode"] not in SSLMODES:
        raise ValueError(f"sslmode must be one of {', '.join(SSLMODES)}, not {query['sslmode']!r}")
    if "target_session_attrs" in query and query["target_session_attrs"] not in SESSION_ATTRS:
        raise ValueError(
            f"target_session_attrs must be one of {', '.join(SESSION_ATTRS)},"
            f" not {query['target_session_attrs']!r}"
        )
    for name in ("connect_timeout", "prepared_statement_cache_size"):
        if name in query:
            _whole_number(name, _one(url, name))
    pool_options(url)  # checks the pool's parameters
    if "password" in query:
        if url.password is not None:
            raise ValueError(
                "the database URL gives a password twice (user:password@ and ?password=)"
            )
        url = url.set(password=_one(url, "password")).difference_update_query(["password"])
    return url


def _whole_number(name: str, text: str) -> int:
    stripped = text.strip()
    if not stripped.isdigit():
        raise ValueError(f"{name} must be a whole number >= 0, not {text!r}")
    return int(stripped)


def split(url: URL, given: Mapping[str, Any] | None = None) -> tuple[URL, dict[str, Any]]:
    """The URL without its libpq parameters, and the driver's ``connect()`` keyword
    arguments: ``given`` plus the asyncpg arguments that carry those parameters.

    Where both set the same argument, ``given`` wins (``server_settings`` are merged
    setting by setting). SQLite URLs come back as they are, with ``given``.

    Raises:
        ValueError: as ``normalize``; or a certificate or key file that does not exist.
    """
    url = normalize(url)
    merged = dict(given or {})
    if not _is_postgres(url):
        return url, merged
    query = url.query
    args: dict[str, Any] = {}
    tls = {name: _one(url, name) for name in _TLS if name in query}
    for name in ("sslrootcert", "sslcert", "sslkey"):
        if name in tls and not os.path.isfile(tls[name]):
            raise ValueError(f"{name}: no such file: {tls[name]}")
    if tls:
        args["dsn"] = "postgresql://?" + urlencode(tls)
    if "connect_timeout" in query:
        seconds = _whole_number("connect_timeout", _one(url, "connect_timeout"))
        args["timeout"] = None if seconds == 0 else float(max(seconds, 2))
    settings = {name: _one(url, name) for name in ("application_name", "options") if name in query}
    if settings:
        args["server_settings"] = settings
    if "target_session_attrs" in query:
        args["target_session_attrs"] = _one(url, "target_session_attrs")
    if "server_settings" in args and "server_settings" in merged:
        merged["server_settings"] = {**args["server_settings"], **merged["server_settings"]}
    return url.difference_update_query((*_LIBPQ, *URL_PARAMS, *_STORE)), {**args, **merged}


def display(url: URL) -> str:
    """The URL as text for messages and output: every password shown as ``***``."""
    url = normalize(url) if _is_postgres(url) else url
    secrets = [name for name in _SECRET if name in url.query]
    text = url.difference_update_query(secrets).render_as_string(hide_password=True)
    for name in secrets:
        text += ("&" if "?" in text else "?") + f"{name}={_HIDDEN}"
    return text
