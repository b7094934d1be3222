"""docs/deploying-postgres.md: every fenced block on the page is run, as written.

One throwaway cluster with TLS serves the module (its role names are cluster-wide, so
never the shared server). The page's placeholders are pointed at it: the host
``db.example.com`` (any port, the pooler's 6432 included: ``pooler="transaction"`` is
run against the server directly here; PgBouncer itself is test_pooler's) becomes the
cluster, the database ``app`` becomes the database of the section under test, and the
provider's CA file becomes the cluster's CA. Then, by the block's language:

* ``sql``: run as the superuser in that database (``ON_ERROR_STOP``);
* ``python``: run as a script by this Python, in an empty HOME (no ``~/.postgresql``);
  its exit status must be 0 and its output is checked;
* ``sh``: run by ``bash -e`` with the virtualenv's ``histstore`` and the server's
  ``psql`` on the PATH; every command must be one of those two, and must succeed;
* ``text``: output the page shows; each is compared with what the code really prints.

Every section's test claims the blocks it ran and checks that it ran all of its
section's; a block of another language, an indented or unclosed fence, or blocks in a
section no test runs fail ``test_every_block_is_run_by_a_test``.
"""

from __future__ import annotations

import ast
import asyncio
import os
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from alembic import command
from helpers import PYTHON, REPO, subprocess_env
from pg_cluster import PASSWORD, Cluster, find_bin, throwaway_cluster
from sqlalchemy import URL, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

import histstore
from histstore import admin
from histstore._storage import migrations as _migrations
from histstore._storage.engine import resolve_target
from histstore.cli import main as cli_main

PAGE = REPO / "docs" / "deploying-postgres.md"
KINDS = ("sql", "python", "sh", "text")
COMMANDS = ("histstore", "psql")
"""The only programs an ``sh`` block may run."""

HOST = re.compile(r"db\.example\.com(?::\d+)?/app\b")
CA_FILE = "/etc/ssl/provider-ca.pem"
MIGRATOR = ("histstore_migrator", "change-me")
APP = ("histstore_app", "change-me-too")
SCHEMA = "histstore"
OLD = "5c1e0a7d2b41"
"""The revision the upgrade section's database starts at: before the search revision,
so the ``--sql`` script names ``histstore reindex``."""
REVISION = re.compile(r"\b[0-9a-f]{12}\b")

ROLES = "The least-privilege role"
URLS = "Connection URLs from providers"
POOLER = "Behind a transaction-mode pooler"
FAILURES = "Failures you will see"
UPGRADING = "Upgrading"
ROLLING = "Rolling upgrades and older processes"
SECTIONS = (URLS, POOLER, ROLES, FAILURES, UPGRADING, ROLLING)
"""The sections with blocks, each run by the test named after it, in page order."""


# ---------------------------------------------------------------------------- the page


@dataclass(frozen=True)
class Block:
    """One fenced block: its ``##`` section, language, text and first line number."""

    section: str
    kind: str
    body: str
    line: int


def read_blocks(page: Path = PAGE) -> list[Block]:
    """Every fenced block on the page, in order.

    Raises:
        AssertionError: an indented fence (a block in a list item is easily missed) or a
            fence that is never closed.
    """
    found: list[Block] = []
    section = ""
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        stripped = line.lstrip()
        if stripped.startswith("```"):
            assert stripped == line, f"{page.name}:{i + 1}: indented fence"
            kind = line[3:].strip()
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            assert end is not None, f"{page.name}:{i + 1}: fence never closed"
            body = "\n".join(lines[i + 1 : end]) + "\n"
            found.append(Block(section, kind, body, i + 1))
            i = end
        i += 1
    return found


def blocks_of(section: str) -> list[Block]:
    return [b for b in read_blocks() if b.section == section]


@dataclass
class Runner:
    """Runs one section's blocks against the cluster and remembers which it ran."""

    cluster: Cluster
    section: str
    workdir: Path
    database: str = "app"
    ran: list[Block] = field(default_factory=list)

    def blocks(self, kind: str) -> list[Block]:
        found = [b for b in blocks_of(self.section) if b.kind == kind]
        assert found, f"no {kind} block in {self.section!r}"
        return found

    def place(self, source: str) -> str:
        """The page's placeholders pointed at the cluster and this section's database."""
        assert self.cluster.certs is not None
        placed = HOST.sub(f"127.0.0.1:{self.cluster.port}/{self.database}", source)
        placed = placed.replace(CA_FILE, str(self.cluster.certs / "ca.crt"))
        placed = re.sub(r"\bDATABASE app\b", f"DATABASE {self.database}", placed)
        assert "db.example.com" not in placed, "a URL the test cannot point at the cluster"
        return placed

    def url(self, role: tuple[str, str], query: str = "") -> str:
        user, password = role
        return self.cluster.url(user=user, password=password, database=self.database, query=query)

    def env(self) -> dict[str, str]:
        env = subprocess_env()
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        env["HOME"] = str(home)
        env["NO_COLOR"] = "1"
        for name in list(env):
            if name.startswith("PG") or name == "HISTSTORE_URL":
                del env[name]
        psql = find_bin("psql")
        assert psql is not None, "psql is needed to run the page's sh blocks"
        bins = [str(Path(sys.executable).parent), str(Path(psql).parent)]
        env["PATH"] = os.pathsep.join([*bins, env.get("PATH", "")])
        return env

    def sql(self, block: Block) -> str:
        assert block.kind == "sql"
        self.ran.append(block)
        return self.cluster.psql(self.place(block.body), database=self.database)

    def python(self, block: Block) -> str:
        """Run the block as a script; its stdout."""
        assert block.kind == "python"
        self.ran.append(block)
        script = self.workdir / f"block_{block.line}.py"
        script.write_text(self.place(block.body))
        done = subprocess.run(
            [PYTHON, str(script)],
            cwd=self.workdir,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{PAGE.name}:{block.line}:\n{done.stderr}"
        return done.stdout

    def sh(self, block: Block) -> subprocess.CompletedProcess[str]:
        """Run the block's commands, each of which must succeed."""
        assert block.kind == "sh"
        self.ran.append(block)
        for line in block.body.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                program = shlex.split(line)[0]
                assert program in COMMANDS, f"{PAGE.name}:{block.line}: runs {program}"
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", self.place(block.body)],
            cwd=self.workdir,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, f"{PAGE.name}:{block.line}:\n{done.stderr}"
        for _, password in (MIGRATOR, APP):
            assert password not in done.stdout + done.stderr
        return done

    def compared(self, block: Block) -> str:
        """A ``text`` block, claimed by a check that compares it with real output."""
        assert block.kind == "text"
        self.ran.append(block)
        return " ".join(block.body.split())

    def assert_all_ran(self) -> None:
        assert sorted(b.line for b in self.ran) == [b.line for b in blocks_of(self.section)]


def test_every_block_is_run_by_a_test() -> None:
    blocks = read_blocks()
    for block in blocks:
        assert block.kind in KINDS, f"{PAGE.name}:{block.line}: ```{block.kind} is not run"
    assert tuple(dict.fromkeys(b.section for b in blocks)) == SECTIONS


# ---------------------------------------------------------------------------- the cluster


@dataclass
class Deployment:
    """The cluster after the role section's ``sql`` and ``sh`` blocks ran in ``app``."""

    cluster: Cluster
    ran: list[Block]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with throwaway_cluster(tls=True) as cluster:
        runner = Runner(cluster, ROLES, tmp_path_factory.mktemp("roles"))
        for block in runner.blocks("sql"):
            runner.sql(block)

        async def refused() -> None:
            # Before the migrator ran, the application role may not create the tables.
            with pytest.raises(histstore.SchemaError, match="histstore migrate"):
                await histstore.connect(runner.url(APP), schema=SCHEMA)

        asyncio.run(refused())
        for block in runner.blocks("sh"):
            runner.sh(block)
        yield Deployment(cluster, runner.ran)


@pytest.fixture
def cluster(deployed: Deployment) -> Cluster:
    return deployed.cluster


# ---------------------------------------------------------------------------- sections


async def test_connection_urls_from_providers(cluster: Cluster, tmp_path: Path) -> None:
    runner = Runner(cluster, URLS, tmp_path)
    (python,) = runner.blocks("python")
    lines = runner.python(python).splitlines()
    assert lines[0] == "True"  # written and read over verify-full TLS
    assert "unsupported parameter 'statement_cache_size'" in lines[1]
    assert "change-me-too" not in "\n".join(lines)
    (sh,) = runner.blocks("sh")
    assert "over-tls" in runner.sh(sh).stdout
    runner.assert_all_ran()


async def test_behind_a_transaction_mode_pooler(cluster: Cluster, tmp_path: Path) -> None:
    runner = Runner(cluster, POOLER, tmp_path)
    (python,) = runner.blocks("python")
    assert runner.python(python).splitlines() == ["True"]
    (sh,) = runner.blocks("sh")
    out = runner.sh(sh).stdout
    assert "schema already at the newest revision" in out
    assert "pooled" in out
    runner.assert_all_ran()


async def test_the_least_privilege_role(deployed: Deployment, tmp_path: Path) -> None:
    cluster = deployed.cluster
    runner = Runner(cluster, ROLES, tmp_path, ran=list(deployed.ran))  # sql, sh: the fixture
    (python,) = runner.blocks("python")
    assert "hello" in runner.python(python)
    app = runner.url(APP)

    async with histstore.connect(app, schema=SCHEMA) as store:
        conversation = "least-privilege"
        await store.write(conversation, [{"role": "user", "content": "find the walrus"}])
        await store.merge_metadata(conversation, {"team": "docs"})
        async with store.lease(conversation, ttl=5):
            assert await store.status(conversation)
        assert [h.conversation for h in await store.search("walrus")] == [conversation]
        value = await store.edit(conversation)
        value.splice(0, 1, [{"role": "user", "content": "find the seal"}], by="editor")
        await store.commit(value)
        assert (await store.read(conversation))[0].to_dict()["content"] == "find the seal"
        assert len(await store.changes(conversation)) == 2
        await store.clear(conversation)
        assert not await store.exists(conversation)
    with pytest.raises(RuntimeError, match=r"must be owner|permission denied"):
        cluster.psql_as(
            "DROP TABLE histstore.histstore_messages",
            user=APP[0],
            password=APP[1],
            database="app",
        )
    runner.assert_all_ran()


def definitions(runner: Runner, block: Block) -> dict[str, Any]:
    """The imports, constants and functions a ``python`` block defines, without running
    its top-level calls."""
    tree = ast.parse(runner.place(block.body))
    kept = (ast.Import, ast.ImportFrom, ast.Assign, ast.FunctionDef, ast.AsyncFunctionDef)
    tree.body = [node for node in tree.body if isinstance(node, kept)]
    namespace: dict[str, Any] = {}
    exec(compile(tree, f"{PAGE.name}:{block.line}", "exec"), namespace)
    return namespace


async def test_failures_you_will_see(cluster: Cluster, tmp_path: Path) -> None:
    runner = Runner(cluster, FAILURES, tmp_path)
    (python,) = runner.blocks("python")
    lines = runner.python(python).splitlines()
    assert lines[0].startswith("WriteOutcome(accepted=1, uncertain=False, length="), lines
    assert lines[1] == "transient: True sqlstate: None"
    runner.assert_all_ran()

    # The block's helper waits out a real outage: the server is down when it starts
    # and back half a second later.
    write_patiently = definitions(runner, python)["write_patiently"]
    async with histstore.connect(runner.url(APP), schema=SCHEMA) as store:
        await asyncio.to_thread(cluster.stop, "fast")

        async def come_back() -> None:
            await asyncio.sleep(0.5)
            await asyncio.to_thread(cluster.start)

        batch = [{"role": "user", "content": "through the outage"}]
        restarted = asyncio.ensure_future(come_back())
        try:
            outcome = await write_patiently(store, "outage", batch)
        finally:
            await restarted  # the cluster is up again for the other tests, whatever happened
        assert outcome.accepted == 1
        assert [m.content for m in await store.read("outage")] == ["through the outage"]


def _to_old_revision(connection: Connection) -> None:
    """As the migrator: histstore's tables at ``OLD``, holding one conversation."""
    command.upgrade(_migrations.alembic_config(connection, schema=SCHEMA), OLD)
    connection.execute(
        text(
            "INSERT INTO histstore.histstore_conversations"
            " (id, owner, system_prompt, length, created_at, updated_at)"
            " VALUES ('from-before', NULL, NULL, 1, now(), now())"
        )
    )
    connection.execute(
        text(
            "INSERT INTO histstore.histstore_messages"
            " (conversation_id, position, role, data, token_count, created_at)"
            " VALUES ('from-before', 0, 'assistant', '{\"role\": \"assistant\","
            ' "content": "an old walrus", "tool_calls": [{"id": "c", "type": "function",'
            ' "function": {"name": "f", "arguments": "{\\"q\\": \\"narwhal\\"}"}}]}\','
            " NULL, now())"
        )
    )


async def _revision(url: str) -> str | None:
    return (await admin.migration_status(url, schema=SCHEMA)).current


async def test_upgrading(
    cluster: Cluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    database = f"app_{uuid.uuid4().hex[:8]}"
    runner = Runner(cluster, UPGRADING, tmp_path, database=database)
    cluster.psql(f'CREATE DATABASE "{database}"')
    # The role section's setup in this database (the roles exist cluster-wide already).
    (roles,) = [b for b in blocks_of(ROLES) if b.kind == "sql"]
    statements = [s for s in roles.body.split(";") if s.strip()]
    setup = [s for s in statements if not s.strip().startswith("CREATE ROLE")]
    cluster.psql(";".join(setup), database=database)
    migrator, app = runner.url(MIGRATOR), runner.url(APP)
    resolved = resolve_target(migrator)
    assert isinstance(resolved, URL)
    engine = create_async_engine(resolved, poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_to_old_revision)
    finally:
        await engine.dispose()
    assert await _revision(migrator) == OLD

    # The give-up line, from the command itself, behind a live writer's locks; its
    # retries are shortened here (their timing is test_migrate_upgrades').
    (shown,) = runner.blocks("text")
    monkeypatch.setattr(_migrations, "RETRY_DELAYS", (0.0, 0.0, 0.0))
    writer = await asyncpg.connect(cluster.url(password=PASSWORD, database=database))
    try:
        await writer.execute("BEGIN")
        await writer.execute(
            "LOCK TABLE histstore.histstore_conversations, histstore.histstore_messages"
            " IN ROW EXCLUSIVE MODE"
        )
        capsys.readouterr()
        args = ["migrate", "--lock-timeout", "0.2", "--schema", SCHEMA, "--url", migrator]
        with pytest.raises(SystemExit) as exited:
            await asyncio.to_thread(cli_main, args)
        assert exited.value.code == 1
        said = capsys.readouterr().err
    finally:
        await writer.close()
    assert len(said.splitlines()) == 1
    assert MIGRATOR[1] not in said

    def normal(line: str) -> str:
        line = runner.place(line).replace(f"127.0.0.1:{cluster.port}/{database}", "HOST/DB")
        line = re.sub(r"over \d+ s", "over N s", line)
        return REVISION.sub("REV", " ".join(line.split()))

    assert normal(runner.compared(shown)) == normal(said)
    assert await _revision(migrator) == OLD  # nothing was changed

    in_order = [b for b in blocks_of(UPGRADING) if b.kind in ("sql", "sh")]
    review, reindex, offline, again = in_order
    runner.sh(review)
    script = (tmp_path / "upgrade.sql").read_text()
    assert script.count("COMMIT;") == 1
    tail = script[script.index("COMMIT;") :]
    assert "histstore reindex" in tail  # the one follow-up, as comments after the script
    assert await _revision(migrator) == _migrations.revisions()[-1]
    async with histstore.connect(app, schema=SCHEMA) as store:
        # The text beyond the string content (the tool call's) is not there yet.
        assert [h.conversation for h in await store.search("walrus")] == ["from-before"]
        assert await store.search("narwhal") == []
    runner.sh(reindex)
    async with histstore.connect(app, schema=SCHEMA) as store:
        assert [h.conversation for h in await store.search("narwhal")] == ["from-before"]
        assert [m.content for m in await store.read("from-before")] == ["an old walrus"]
    assert OLD in offline.body
    runner.sh(offline)
    assert (tmp_path / "upgrade-offline.sql").read_text() == script
    assert "schema already at the newest revision" in runner.sh(again).stdout
    runner.assert_all_ran()
    cluster.psql(f'DROP DATABASE "{database}" WITH (FORCE)')


async def test_rolling_upgrades_and_older_processes(cluster: Cluster, tmp_path: Path) -> None:
    runner = Runner(cluster, ROLLING, tmp_path)
    (python,) = runner.blocks("python")
    assert runner.python(python).splitlines() == [
        "WriteOutcome(accepted=0, uncertain=False, length=None)"
    ]
    # What an older histstore's append sends: a message without an entry id.
    (shown,) = runner.blocks("text")
    with pytest.raises(RuntimeError) as refused:
        cluster.psql_as(
            "INSERT INTO histstore.histstore_messages"
            " (conversation_id, position, role, data, created_at)"
            " VALUES ('older-writer', 0, 'user', '{}', now())",
            user=APP[0],
            password=APP[1],
            database="app",
        )
    assert runner.compared(shown) in " ".join(str(refused.value).split())
    stored = (
        "SELECT count(*) FROM histstore.histstore_messages WHERE conversation_id = 'older-writer'"
    )
    assert cluster.psql(stored, database="app").strip() == "0"
    runner.assert_all_ran()
