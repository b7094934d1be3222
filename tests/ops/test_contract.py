"""Contract edges found by users: storable values agree across backends, typed errors
instead of raw ones, the store's lifecycle, errors that say the database's reason."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
import reach
from conftest import Backend
from helpers import PG_ADMIN_URL, _pg_execute, connections_in_use, new_id, stable_id, user_msgs
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import histstore
from histstore import (
    CommitError,
    ConversationState,
    HistStoreError,
    InvalidId,
    InvalidMessage,
    Message,
    NotFound,
    Store,
    WriteError,
    WriteOutcome,
)
from histstore._storage.engine import resolve_target

ZERO = WriteOutcome(0, False, None)

# ---------------------------------------------------------------- storable on every backend


@pytest.mark.parametrize("role", ["us\x00er", "\x00", "system\x00", "\x01\x7f"], ids=stable_id)
async def test_any_role_string_round_trips(store: Store, cid: str, role: str) -> None:
    message = {"role": role, "content": "x\x00y"}
    await store.write(cid, [message, Message.system("rules")])
    assert await store.read(cid) == [Message.from_dict(message), Message.system("rules")]
    # Only the real system message is one (the role index never confuses them).
    assert [m.content for m in await store.system_messages(cid)] == ["rules"]


@pytest.mark.parametrize(
    "prompt", ["nul\x00inside", "\x00", "lone \ud800 surrogate", "\udfff"], ids=stable_id
)
async def test_unstorable_system_prompt_is_refused_everywhere(
    store: Store, cid: str, prompt: str
) -> None:
    with pytest.raises(InvalidMessage):
        await store.save(ConversationState(cid, system_prompt=prompt, messages=user_msgs(1)))
    assert not await store.exists(cid)


async def test_storable_system_prompt_round_trips(store: Store, cid: str) -> None:
    prompt = "tabs\tnew\nlines \x01 \u2028 \U0001f600"
    await store.save(ConversationState(cid, system_prompt=prompt))
    assert (await store.load(cid)).system_prompt == prompt


@pytest.mark.parametrize("count", [2**31, -1, 2**63, 1.5, True], ids=stable_id)
async def test_token_counts_out_of_range_are_refused_before_writing(
    backend: Backend, cid: str, count: Any
) -> None:
    async with backend.connect(count_tokens=lambda m: count) as store:
        with pytest.raises(InvalidMessage) as info:
            await store.write(cid, user_msgs(2))
        assert info.value.outcome == ZERO
        assert not await store.exists(cid)


@pytest.mark.parametrize("at", [2**63, 2**64])
async def test_positions_beyond_64_bits_are_refused(store: Store, cid: str, at: int) -> None:
    with pytest.raises(ValueError, match="2\\*\\*63"):
        await store.write(cid, user_msgs(1), at=at)
    with pytest.raises(ValueError, match="2\\*\\*63"):
        await store.read(cid, start=at)
    assert not await store.exists(cid)


# ---------------------------------------------------------------- typed errors


async def test_metadata_filter_must_be_a_mapping(store: Store) -> None:
    with pytest.raises(TypeError, match="mapping"):
        await store.conversations(metadata="x")  # type: ignore[arg-type]


async def test_write_validation_errors_carry_the_zero_outcome_and_name_the_conversation(
    store: Store, cid: str
) -> None:
    cases: list[tuple[Any, dict[str, Any]]] = [
        ([{"content": "no role"}], {}),
        ([{"role": "user", "content": float("nan")}], {}),
        ([{"role": "user", "content": "\ud800"}], {}),
        (user_msgs(1), {"idempotency_key": "bad\x00key"}),
        ("not a list", {}),
    ]
    for batch, options in cases:
        with pytest.raises((InvalidMessage, InvalidId)) as info:
            await store.write(cid, batch, **options)
        assert info.value.outcome == ZERO
        if isinstance(info.value, InvalidMessage) and batch != "not a list":
            assert cid in str(info.value)
    assert not await store.exists(cid)


async def test_with_history_turns_any_write_failure_into_commit_error(
    store: Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def model(messages: list[Message]) -> Message:
        return Message.assistant("hello")

    async def broken_write(*args: Any, **kwargs: Any) -> WriteOutcome:
        raise RuntimeError("a store wrapper failed")

    chat = histstore.with_history(store, model)
    monkeypatch.setattr(store, "write", broken_write)
    with pytest.raises(CommitError) as info:
        await chat(cid, [Message.user("hi")])
    assert isinstance(info.value.__cause__, RuntimeError)
    assert info.value.outcome == WriteOutcome(0, True, None)  # nothing known of it
    monkeypatch.undo()
    await info.value.retry(store)
    assert [m.content for m in await store.read(cid)] == ["hi", "hello"]


# ---------------------------------------------------------------- lifecycle


async def _every_call(st: Store, c: str) -> list[Any]:
    return [
        st.read(c),
        st.count(c),
        st.exists(c),
        st.write(c, user_msgs(1)),
        st.pop(c),
        st.clear(c),
        st.load(c),
        st.save(ConversationState(c)),
        st.fork(c, new_id()),
        st.metadata(c),
        st.merge_metadata(c, {"k": 1}),
        st.list_append(c, "l", [1]),
        st.list_load(c, "l"),
        st.list_len(c, "l"),
        st.summaries(c),
        st.system_messages(c),
        st.conversations(),
        st.purge(idle_for=__import__("datetime").timedelta(0)),
    ]


async def test_after_close_every_call_on_the_store_and_its_views_fails(
    backend: Backend, cid: str
) -> None:
    store = await backend.connect()
    view = store.scoped("alice")
    await view.write(cid, user_msgs(2))
    await store.close()
    assert store.closed
    assert view.closed
    for st in (store, view):
        for call in await _every_call(st, cid):
            with pytest.raises(HistStoreError, match="closed"):
                await call
    with pytest.raises(HistStoreError, match="closed"):
        store.scoped("bob")
    await store.close()  # still idempotent
    await view.close()


async def test_closing_holds_no_connection_of_a_borrowed_engine(shared_backend: Backend) -> None:
    url = resolve_target(shared_backend.url)
    assert not isinstance(url, AsyncEngine)
    engine = create_async_engine(url)
    try:
        store = await histstore.connect(engine)
        view = store.scoped("alice")
        c = new_id()
        await asyncio.gather(*(view.write(c, user_msgs(1)) for _ in range(5)))
        await asyncio.gather(*(view.read(c) for _ in range(5)), store.count(c))
        await store.close()
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        with pytest.raises(HistStoreError):
            await view.write(c, user_msgs(1))
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        await engine.dispose()


async def test_a_second_event_loop_gets_an_error_and_the_store_goes_on(
    backend: Backend, cid: str
) -> None:
    async with backend.connect() as store:
        await store.write(cid, user_msgs(2))
        view = store.scoped("alice")

        def elsewhere() -> list[str]:
            async def calls() -> list[str]:
                errors = []
                for call in (store.read(cid), store.write(cid, user_msgs(1)), view.count(cid)):
                    try:
                        await call
                    except HistStoreError as exc:
                        errors.append(str(exc))
                return errors

            return asyncio.run(calls())

        errors = await asyncio.to_thread(elsewhere)
        assert len(errors) == 3
        assert all("event loop" in e for e in errors)
        await store.write(cid, user_msgs(1, "after"))
        assert await store.count(cid) == 3
        assert connections_in_use(store) == 0


# ---------------------------------------------------------------- errors say why


async def test_readonly_sqlite_database_says_so(tmp_path: Path, cid: str) -> None:
    async with histstore.connect(tmp_path / "ro.db") as store:
        await store.write(cid, user_msgs(1))
        # Make the connection the next write takes (the writer's) refuse writes, as a
        # read-only file does.
        async with reach.write_connection(store) as conn:
            await conn.execute("PRAGMA query_only = ON")
        with pytest.raises(WriteError, match="readonly") as info:
            await store.write(cid, user_msgs(1, "secret-content"))
        assert "secret-content" not in str(info.value)
        assert info.value.outcome == ZERO
        assert await store.count(cid) == 1


async def test_full_sqlite_database_says_so(tmp_path: Path, cid: str) -> None:
    async with histstore.connect(tmp_path / "full.db") as store:
        await store.write(cid, user_msgs(1))
        # Cap the file at its current size on the connection the next write takes.
        async with reach.write_connection(store) as conn:
            pages = (await conn.execute_fetchall("PRAGMA page_count"))[0][0]
            await conn.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(WriteError, match="full") as info:
            await store.write(cid, [{"role": "user", "content": "y" * 200_000}])
        assert "yyyy" not in str(info.value)


def _pg(database: str, user: str = "postgres") -> str:
    url = make_url(PG_ADMIN_URL).set(database=database, username=user, password=None)
    return url.render_as_string(hide_password=False)


@pytest.mark.postgres
async def test_missing_database_and_role_say_so(pg_url: str) -> None:
    missing = f"nodb_{uuid.uuid4().hex[:8]}"
    with pytest.raises(HistStoreError, match=f'database "{missing}" does not exist'):
        await histstore.connect(_pg(missing))
    role = f"norole_{uuid.uuid4().hex[:8]}"
    with pytest.raises(HistStoreError, match=f'role "{role}" does not exist'):
        await histstore.connect(_pg(make_url(pg_url).database or "", role))


@pytest.mark.postgres
async def test_permission_denied_says_so(pg_url: str, cid: str) -> None:
    role = f"reader_{uuid.uuid4().hex[:8]}"
    database = make_url(pg_url).database or ""
    await _pg_execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        async with histstore.connect(_pg(database, role), migrate=False) as store:
            with pytest.raises(HistStoreError, match="permission denied") as info:
                await store.write(cid, user_msgs(1, "private-text"))
            assert "private-text" not in str(info.value)
            with pytest.raises(HistStoreError, match="permission denied"):
                await store.read(cid)
    finally:
        await _pg_execute(f'DROP ROLE IF EXISTS "{role}"')


async def test_sqlite_errors_are_wrapped_with_their_cause(tmp_path: Path) -> None:
    path = tmp_path / "not-a-db.db"
    path.write_bytes(b"this is not a database file" * 100)
    with pytest.raises(HistStoreError, match="not a database") as info:
        await histstore.connect(path)
    assert isinstance(info.value.__cause__, (sqlite3.Error, Exception))


async def test_not_found_through_a_view_is_typed(store: Store, cid: str) -> None:
    await store.write(cid, user_msgs(1))
    with pytest.raises(NotFound):
        await store.scoped("alice").write(cid, user_msgs(1))
