"""Throwaway PostgreSQL clusters for the tests that need a server of their own.

A cluster is made with ``initdb`` as the ``postgres`` user (the server refuses to run as
root), listens on a free loopback port, and is removed when the test is done. It can
carry TLS (a self-signed certificate made with ``openssl``) and scram password auth,
and be stopped (``-m fast``) and started again under load.

``find_bin`` finds the server's programs on Debian (``/usr/lib/postgresql/N/bin``) or on
the ``PATH``. Without them, or without a ``postgres`` user when running as root, the
tests that need a cluster are skipped, unless ``HISTSTORE_REQUIRE_POSTGRES`` is set
(CI), which turns the skip into a failure.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REQUIRE_PG = os.environ.get("HISTSTORE_REQUIRE_POSTGRES", "") not in ("", "0")
PASSWORD = "s3cret-pw"
"""The password of the cluster's ``app`` role (scram-sha-256 over TCP)."""


def find_bin(name: str) -> str | None:
    """The path of a PostgreSQL server program, newest installed version first."""
    lib = Path("/usr/lib/postgresql")
    if lib.is_dir():
        for version in sorted(lib.iterdir(), key=lambda p: p.name, reverse=True):
            candidate = version / "bin" / name
            if candidate.is_file():
                return str(candidate)
    return shutil.which(name)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _unavailable(why: str) -> None:
    if REQUIRE_PG:
        pytest.fail(f"a throwaway PostgreSQL cluster is required but {why}")
    pytest.skip(f"no throwaway PostgreSQL cluster: {why}")


def _as_owner(
    argv: list[str], owner: str | None, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``owner`` (when running as root), raising on failure."""
    if owner is not None:
        argv = ["runuser", "-u", owner, "--", *argv]
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]


@dataclass
class Cluster:
    """A running throwaway cluster: ``url(...)`` builds connection URLs to it."""

    datadir: Path
    port: int
    owner: str | None
    tls: bool
    certs: Path | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.datadir.parent / "server.log"

    def url(
        self,
        *,
        user: str = "postgres",
        password: str | None = None,
        database: str = "postgres",
        query: str = "",
    ) -> str:
        """A ``postgresql://`` URL to the cluster (``query`` without the ``?``)."""
        auth = user if password is None else f"{user}:{password}"
        tail = f"?{query}" if query else ""
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}{tail}"

    def _ctl(self, *args: str) -> None:
        pg_ctl = find_bin("pg_ctl")
        assert pg_ctl is not None
        _as_owner([pg_ctl, "-D", str(self.datadir), "-l", str(self.log), "-w", *args], self.owner)

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._ctl("-o", f"-p {self.port} -k {self.datadir.parent}", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: abort sessions, roll back their transactions)."""
        self._ctl("-m", mode, "stop")

    def promote(self) -> None:
        """Promote a standby to a primary and wait until it accepts writes."""
        self._ctl("promote")

    def configure(self, *settings: str) -> None:
        """Append ``settings`` (``name = value`` lines) to postgresql.conf and reload."""
        with (self.datadir / "postgresql.conf").open("a") as fh:
            fh.write("\n".join(settings) + "\n")
        self.psql("SELECT pg_reload_conf()")

    def psql(self, sql: str, *, database: str = "postgres") -> str:
        """Run ``sql`` as the superuser over the cluster's socket; its output."""
        psql = find_bin("psql")
        assert psql is not None
        out = _as_owner(
            [
                psql,
                "-h",
                str(self.datadir.parent),
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                database,
                "-v",
                "ON_ERROR_STOP=1",
                "-qAtc",
                sql,
            ],
            self.owner,
        )
        return out.stdout

    def psql_as(self, sql: str, *, user: str, password: str, database: str) -> str:
        """Run ``sql`` as ``user`` over TCP with its password (scram); its output."""
        psql = find_bin("psql")
        assert psql is not None
        out = subprocess.run(
            [
                psql,
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                user,
                "-d",
                database,
                "-v",
                "ON_ERROR_STOP=1",
                "-qAtc",
                sql,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PGPASSWORD": password},
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(out.stderr.strip())
        return out.stdout


def openssl(where: Path, *args: str) -> None:
    """Run ``openssl ARGS`` in ``where``, raising on failure."""
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=where)


def make_ca(where: Path, stem: str, name: str) -> Path:
    """A self-signed CA in ``where``: ``STEM.key`` and ``STEM.crt`` (returned)."""
    openssl(
        where,
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-keyout",
        f"{stem}.key",
        "-out",
        f"{stem}.crt",
    )
    return where / f"{stem}.crt"


def _make_certs(where: Path) -> None:
    """A self-signed CA and a server certificate for 127.0.0.1/localhost."""

    def ssl(*args: str) -> None:
        openssl(where, *args)

    make_ca(where, "ca", "histstore test CA")
    (where / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    ssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    )
    ssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "server.crt",
    )


@contextmanager
def throwaway_cluster(*, tls: bool = False, settings: Sequence[str] = ()) -> Iterator[Cluster]:
    """A new cluster, started; stopped and removed afterwards. ``settings``: lines added
    to its ``postgresql.conf`` (they win over the defaults here).

    Local (socket) connections trust everyone; every TCP login needs a password
    (scram-sha-256): ``postgres`` and ``app`` both have ``PASSWORD``. The role
    ``app`` (owner of the database ``app``) is what the tests connect as. With
    ``tls`` the server has ``ssl=on`` with a self-signed certificate, verified by
    ``cluster.certs / "ca.crt"``.
    """
    initdb = find_bin("initdb")
    if initdb is None or find_bin("pg_ctl") is None:
        _unavailable("initdb/pg_ctl are not installed")
    owner: str | None = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("running as root and there is no 'postgres' user")
        owner = "postgres"
    if tls and shutil.which("openssl") is None:
        _unavailable("openssl is not installed")
    base = Path(tempfile.mkdtemp(prefix="histstore-pg-"))
    datadir = base / "data"
    try:
        _hand_over(base, owner)
        _as_owner(
            [
                initdb,
                "-D",
                str(datadir),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--auth-host=scram-sha-256",
                "--auth-local=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8" if _has_c_utf8() else "--locale=C",
            ],
            owner,
        )
        cluster = Cluster(datadir=datadir, port=free_port(), owner=owner, tls=tls)
        conf = [
            "listen_addresses = '127.0.0.1'",
            "max_connections = 60",
            "shared_buffers = 32MB",
            "fsync = off",
            "synchronous_commit = off",
            "full_page_writes = off",
            "password_encryption = 'scram-sha-256'",
        ]
        if tls:
            certs = base / "certs"
            certs.mkdir()
            _make_certs(certs)
            for name in ("server.crt", "server.key"):
                shutil.copy(certs / name, datadir / name)
                if owner is not None:
                    shutil.chown(datadir / name, user=owner)
                (datadir / name).chmod(0o600)
            for name in certs.iterdir():
                name.chmod(0o644)
            cluster.certs = certs
            conf += ["ssl = on", "ssl_cert_file = 'server.crt'", "ssl_key_file = 'server.key'"]
        conf += settings
        with (datadir / "postgresql.conf").open("a") as fh:
            fh.write("\n".join(conf) + "\n")
        cluster.start()
        cluster.psql(f"CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'")
        cluster.psql("ALTER ROLE postgres PASSWORD '" + PASSWORD + "'")
        cluster.psql("CREATE DATABASE app OWNER app")
        with _stopped_after(cluster):
            yield cluster
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _hand_over(base: Path, owner: str | None) -> None:
    """Give a cluster's base directory to the user the server runs as (when root)."""
    if owner is not None:
        shutil.chown(base, user=owner)
        base.chmod(0o755)


@contextmanager
def _stopped_after(cluster: Cluster) -> Iterator[Cluster]:
    """``cluster``, stopped (``immediate``) when the block ends."""
    try:
        yield cluster
    finally:
        with suppress(subprocess.CalledProcessError):
            cluster.stop("immediate")


@contextmanager
def standby_of(primary: Cluster) -> Iterator[Cluster]:
    """A hot standby of ``primary``, streaming from it: a base backup taken with
    ``pg_basebackup -R`` (which writes ``standby.signal`` and the connection to the
    primary), started on a port of its own; stopped and removed afterwards. Its roles,
    passwords and databases are the primary's."""
    basebackup = find_bin("pg_basebackup")
    if basebackup is None:
        _unavailable("pg_basebackup is not installed")
    assert basebackup is not None
    base = Path(tempfile.mkdtemp(prefix="histstore-standby-"))
    datadir = base / "data"
    try:
        _hand_over(base, primary.owner)
        _as_owner(
            [
                basebackup,
                "-h",
                str(primary.datadir.parent),
                "-p",
                str(primary.port),
                "-U",
                "postgres",
                "-D",
                str(datadir),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
            ],
            primary.owner,
        )
        standby = Cluster(datadir=datadir, port=free_port(), owner=primary.owner, tls=primary.tls)
        standby.certs = primary.certs
        standby.start()
        with _stopped_after(standby):
            yield standby
    finally:
        shutil.rmtree(base, ignore_errors=True)


def wait_for_replay(primary: Cluster, standby: Cluster, timeout: float = 30.0) -> None:
    """Wait until ``standby`` has replayed everything ``primary`` has written so far.

    The target is the WAL's insert position, not its write position: the clusters run
    with ``synchronous_commit = off``, so a commit returns before its record is written
    out, and the write position can still be short of it."""
    target = primary.psql("SELECT pg_current_wal_insert_lsn()").strip()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        behind = standby.psql(
            f"SELECT pg_wal_lsn_diff('{target}', pg_last_wal_replay_lsn()) > 0"
        ).strip()
        if behind == "f":
            return
        time.sleep(0.05)
    raise TimeoutError("the standby did not catch up with the primary")


def _has_c_utf8() -> bool:
    try:
        out = subprocess.run(["locale", "-a"], capture_output=True, text=True, check=False)
    except OSError:
        return False
    return any(line.lower() in ("c.utf8", "c.utf-8") for line in out.stdout.split())


def wait_until_up(cluster: Cluster, timeout: float = 30.0) -> None:
    """Wait until the cluster answers on its port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", cluster.port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError("the throwaway cluster did not come up")
