"""docs/deploying-postgres.md: every ``sql`` and ``python`` block runs as written.

The page's role setup is applied to a throwaway cluster (its role names are cluster-wide,
so never on the shared server), the schema is created as the migrator, and the page's
Python runs as the application role, which then does the contract's work and cannot
change the schema.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO
from pg_cluster import Cluster, throwaway_cluster

import histstore

PAGE = REPO / "docs" / "deploying-postgres.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks(kind: str, page: Path = PAGE) -> list[str]:
    """The fenced blocks of one kind on the page, in order."""
    return [body for lang, body in FENCE.findall(page.read_text()) if lang == kind]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with throwaway_cluster() as made:
        yield made


def test_the_page_has_its_blocks() -> None:
    assert blocks("sql"), "the least-privilege role setup"
    assert blocks("python")


async def test_least_privilege_roles_run_the_contract(cluster: Cluster) -> None:
    database = f"docs_{uuid.uuid4().hex[:8]}"
    cluster.psql(f'CREATE DATABASE "{database}"')
    try:
        for sql in blocks("sql"):
            cluster.psql(sql, database=database)
        migrator = cluster.url(user="histstore_migrator", password="change-me", database=database)
        app = cluster.url(user="histstore_app", password="change-me-too", database=database)

        # Before the migrator ran, the application role may not create the tables.
        with pytest.raises(histstore.SchemaError, match="histstore migrate"):
            await histstore.connect(app, schema="histstore")
        async with histstore.connect(migrator, schema="histstore", migrate=True):
            pass

        for source in blocks("python")[:1]:  # the role section; the merged sections are not run yet
            namespace: dict[str, Any] = {}
            exec(compile(source, str(PAGE), "exec"), namespace)
            if "main" in namespace:
                await namespace["main"](app)

        async with histstore.connect(app, schema="histstore") as store:
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
        with pytest.raises(Exception, match=r"must be owner|permission denied"):
            cluster.psql_as(
                "DROP TABLE histstore.histstore_messages",
                user="histstore_app",
                password="change-me-too",
                database=database,
            )
    finally:
        cluster.psql(f'DROP DATABASE "{database}" WITH (FORCE)')
