"""SPEC 12, "Meaning": SemanticIndex embeds messages, keeps their vectors in the
database, and ranks them by exact cosine similarity.

The embedder is a deterministic bag of words hashed into 16 dimensions, so every
expected ranking can be computed here by brute force.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import struct
import zlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from helpers import new_id
from sqlalchemy import delete, select, update
from waiting import blocked_on_lock

import histstore
from histstore import InvalidId, InvalidMessage, Message
from histstore._ops.semantic import SemanticIndex
from histstore._storage import schema as _schema

Store = histstore.Store
DIMS = 16
MODEL = "bag-16"
VOCAB = ["apple", "banana", "cherry", "delta", "echo", "fox"]
VOCAB += ["golf", "hotel", "india", "juliet", "kilo", "lima"]


def bag(text: str) -> list[float]:
    """The fake embedding: word counts hashed into ``DIMS`` buckets."""
    vector = [0.0] * DIMS
    for word in text.lower().split() or [""]:
        vector[zlib.crc32(word.encode()) % DIMS] += 1.0
    return vector


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


class Boom(Exception):
    pass


class Embedder:
    """Records every call; raises ``Boom`` on call number ``fail_on``; ``during`` runs
    (awaited) inside each call, between receiving the texts and answering."""

    def __init__(
        self,
        fail_on: int | None = None,
        during: Callable[[list[str]], Awaitable[None]] | None = None,
        output: Callable[[list[str]], Any] | None = None,
    ) -> None:
        self.calls: list[list[str]] = []
        self.fail_on = fail_on
        self.during = during
        self.output = output

    async def __call__(self, texts: list[str]) -> Any:
        self.calls.append(list(texts))
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise Boom
        if self.during is not None:
            await self.during(texts)
        return self.output(texts) if self.output else [bag(t) for t in texts]

    @property
    def seen(self) -> list[str]:
        return [t for call in self.calls for t in call]


def says(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": t} for t in texts]


async def vectors(store: Store, conversation: str | None = None) -> list[tuple[str, int, str]]:
    """The stored (conversation, position, model) keys, in key order."""
    v = _schema.vectors
    stmt = select(v.c.conversation_id, v.c.position, v.c.model).order_by(
        v.c.conversation_id, v.c.position, v.c.model
    )
    if conversation is not None:
        stmt = stmt.where(v.c.conversation_id == conversation)
    async with store.engine.connect() as conn:
        return [(c, int(p), m) for c, p, m in (await conn.execute(stmt)).all()]


# ---------------------------------------------------------------- update


async def test_update_embeds_each_message_with_text_once(store: Store) -> None:
    a, b = new_id(), new_id()
    no_text = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    await store.write(a, [*says("apple banana", "cherry"), no_text, *says("delta")])
    await store.write(b, says("echo fox", "golf"))
    embed = Embedder()
    index = SemanticIndex(store, embed, model=MODEL)
    assert await index.update(batch=2) == 5
    assert sorted(embed.seen) == sorted(["apple banana", "cherry", "delta", "echo fox", "golf"])
    assert all(len(call) <= 2 for call in embed.calls)
    assert {(c, p) for c, p, _ in await vectors(store)} == {
        (a, 0), (a, 1), (a, 3), (b, 0), (b, 1)
    }  # fmt: skip
    assert await index.update() == 0
    assert embed.seen.count("cherry") == 1

    await store.write(a, says("hotel"))
    await store.write(b, says("india"))
    assert await index.update(a) == 1
    assert embed.seen[-1] == "hotel"
    assert await index.update(new_id()) == 0  # unknown conversation
    assert await index.update() == 1
    assert embed.seen[-1] == "india"
    # Another model has vectors of its own.
    other = SemanticIndex(store, Embedder(), model="other")
    assert await other.update() == 7
    assert len(await vectors(store)) == 14


async def test_update_walks_across_conversations_in_batches(store: Store) -> None:
    ids = sorted(new_id() for _ in range(4))
    for i, c in enumerate(ids, 1):
        await store.write(c, says(*(f"w{i} n{j}" for j in range(i))))  # 1..4 messages
    embed = Embedder()
    assert await SemanticIndex(store, embed, model=MODEL).update(batch=3) == 10
    assert len(embed.seen) == len(set(embed.seen)) == 10
    assert [len(call) for call in embed.calls] == [3, 3, 3, 1]


async def test_interrupted_update_keeps_finished_batches(store: Store) -> None:
    c = new_id()
    await store.write(c, says(*(f"text {i}" for i in range(7))))
    failing = Embedder(fail_on=2)
    with pytest.raises(Boom):
        await SemanticIndex(store, failing, model=MODEL).update(batch=3)
    assert [p for _, p, _ in await vectors(store)] == [0, 1, 2]
    rest = Embedder()
    assert await SemanticIndex(store, rest, model=MODEL).update(batch=3) == 4
    assert rest.seen == [f"text {i}" for i in range(3, 7)]
    assert len(await vectors(store)) == 7


async def test_message_changed_while_embedding_is_not_stored(store: Store) -> None:
    c = new_id()
    await store.write(c, says("apple", "banana", "cherry"))

    async def change(texts: list[str]) -> None:
        if "cherry" in texts:
            await store.pop(c)  # cherry is gone
            await store.pop(c)
            await store.write(c, says("delta"))  # banana's place holds delta now

    embed = Embedder(during=change)
    index = SemanticIndex(store, embed, model=MODEL)
    assert await index.update() == 1
    assert [p for _, p, _ in await vectors(store)] == [0]
    embed.during = None
    assert await index.update() == 1
    assert embed.seen[-1] == "delta"
    (hit,) = await index.search("delta", k=1)
    assert (hit.position, hit.message.content) == (1, "delta")


async def test_a_delete_under_way_wins_over_the_vector(shared_backend: Any) -> None:
    """A message whose delete is not committed yet when its vector is stored: the
    store waits for the delete, then stores nothing for it (and does not fail)."""
    c = new_id()
    async with shared_backend.connect() as store, shared_backend.connect() as other:
        await store.write(c, says("apple", "banana"))
        m = _schema.messages
        async with other.engine.connect() as conn:
            await conn.begin()
            await conn.execute(delete(m).where(m.c.conversation_id == c, m.c.position == 1))
            task = asyncio.create_task(SemanticIndex(store, Embedder(), model=MODEL).update())
            await blocked_on_lock(task, shared_backend)  # it waits for the deleting transaction
            await conn.commit()
        assert await task == 1
        assert [p for _, p, _ in await vectors(store)] == [0]


async def test_concurrent_updater_wins_without_duplicates(store: Store) -> None:
    c = new_id()
    await store.write(c, says("apple", "banana"))
    rival = SemanticIndex(store, Embedder(), model=MODEL)

    async def race(texts: list[str]) -> None:
        assert await rival.update() == 2

    assert await SemanticIndex(store, Embedder(during=race), model=MODEL).update() == 0
    assert len(await vectors(store)) == 2


# ---------------------------------------------------------------- vectors follow messages


async def make_old(store: Store, conversation: str) -> None:
    conv = _schema.conversations
    async with store.engine.begin() as conn:
        await conn.execute(
            update(conv)
            .where(conv.c.id == conversation)
            .values(updated_at=datetime.now(timezone.utc) - timedelta(days=3))
        )


async def test_vectors_go_with_their_messages(store: Store) -> None:
    a, b, old = new_id(), new_id(), new_id()
    await store.write(a, says("apple", "banana", "cherry"))
    await store.write(b, says("delta", "echo"))
    await store.write(old, says("fox"))
    index = SemanticIndex(store, Embedder(), model=MODEL)
    assert await index.update() == 6

    await store.pop(a)
    assert [p for _, p, _ in await vectors(store, a)] == [0, 1]
    await store.clear(b)
    assert await vectors(store, b) == []
    await make_old(store, old)
    assert await store.purge(idle_for=timedelta(days=1)) == 1
    assert await vectors(store, old) == []

    fork = new_id()
    await store.fork(a, fork)
    assert await vectors(store, fork) == []  # a fork starts unembedded
    assert await index.update() == 2
    assert [p for _, p, _ in await vectors(store, fork)] == [0, 1]
    assert {h.conversation for h in await index.search("apple", k=10)} == {a, fork}


async def test_replaced_message_is_embedded_again(store: Store) -> None:
    c = new_id()
    await store.write(c, says("apple", "banana"))
    embed = Embedder()
    index = SemanticIndex(store, embed, model=MODEL)
    assert await index.update() == 2
    await store.pop(c)
    await store.write(c, says("cherry"))
    assert [p for _, p, _ in await vectors(store)] == [0]  # banana's vector is gone
    assert await index.update() == 1
    assert embed.seen == ["apple", "banana", "cherry"]
    hits = await index.search("banana", k=5)
    assert sorted(h.message.content for h in hits) == ["apple", "cherry"]
    (best,) = await index.search("cherry", k=1)
    assert (best.position, best.message.content) == (1, "cherry")


async def test_delete_then_update_embeds_again(store: Store) -> None:
    a, b = new_id(), new_id()
    await store.write(a, says("apple", "banana"))
    await store.write(b, says("cherry"))
    index = SemanticIndex(store, Embedder(), model=MODEL)
    other = SemanticIndex(store, Embedder(), model="other")
    assert await index.update() == 3
    assert await other.update() == 3
    await index.delete(a)
    assert await vectors(store, a) == [(a, 0, "other"), (a, 1, "other")]
    assert len(await vectors(store, b)) == 2
    await index.delete(a)  # idempotent
    await index.delete(new_id())  # unknown: nothing to do
    assert await index.update() == 2
    assert len(await vectors(store)) == 6


# ---------------------------------------------------------------- search


async def corpus(store: Store, seed: int = 7) -> dict[tuple[str, int], str]:
    rng = random.Random(seed)
    texts: dict[tuple[str, int], str] = {}
    for c in sorted(new_id() for _ in range(3)):
        batch = [" ".join(rng.choices(VOCAB, k=rng.randint(1, 5))) for _ in range(15)]
        batch[3] = batch[9] = "apple banana"  # an exact tie inside a conversation
        await store.write(c, says(*batch))
        texts.update({(c, i): t for i, t in enumerate(batch)})
    return texts


def assert_exact(hits: list[Any], query: str, texts: dict[tuple[str, int], str], k: int) -> None:
    """``hits`` are the top ``k`` of ``texts`` by brute-force cosine with ``query``."""
    q = bag(query)
    truth = {key: cosine(q, bag(t)) for key, t in texts.items()}
    assert len(hits) == min(k, len(texts))
    keys = [(h.conversation, h.position) for h in hits]
    assert len(set(keys)) == len(keys)
    for hit in hits:
        assert hit.score == pytest.approx(truth[hit.conversation, hit.position], abs=1e-6)
        assert hit.message.content == texts[hit.conversation, hit.position]
        assert hit.message.position == hit.position
    for first, second in itertools.pairwise(hits):
        assert first.score >= second.score
        if first.score == second.score:  # ties by (conversation, position)
            assert (first.conversation, first.position) < (second.conversation, second.position)
    rest = [score for key, score in truth.items() if key not in set(keys)]
    if rest:
        assert min(h.score for h in hits) >= max(rest) - 1e-6


async def test_search_ranks_exactly(store: Store) -> None:
    texts = await corpus(store)
    embed = Embedder()
    index = SemanticIndex(store, embed, model=MODEL)
    assert await index.update(batch=16) == len(texts)
    for query in ["apple", "banana cherry", "golf golf hotel", "kilo lima india", "zulu"]:
        for k in (1, 5, 12, 100):
            before = len(embed.calls)
            hits = await index.search(query, k=k)
            assert embed.calls[before:] == [[query]]
            assert_exact(hits, query, texts, k)
    # The exact tie: identical texts score the same and come in key order.
    hits = await index.search("apple banana", k=100)
    tied = [(h.conversation, h.position) for h in hits if h.message.content == "apple banana"]
    assert tied == sorted(tied)
    assert len({h.score for h in hits if h.message.content == "apple banana"}) == 1
    # The stored message, created_at included.
    best = hits[0]
    stored = await store.read(best.conversation, start=best.position, stop=best.position + 1)
    assert best.message == stored[0]
    assert best.message.created_at == stored[0].created_at
    assert isinstance(best.message.created_at, datetime)


async def test_search_in_one_conversation_reads_only_its_vectors(store: Store) -> None:
    texts = await corpus(store, seed=11)
    index = SemanticIndex(store, Embedder(), model=MODEL)
    await index.update()
    first, second, _ = sorted({c for c, _ in texts})
    mine = {key: t for key, t in texts.items() if key[0] == first}
    hits = await index.search("apple echo", conversation=first, k=50)
    assert_exact(hits, "apple echo", mine, 50)
    # Spoil another conversation's vector: searching everything notices, searching
    # ``first`` never reads it.
    v = _schema.vectors
    async with store.engine.begin() as conn:
        await conn.execute(
            update(v).where(v.c.conversation_id == second, v.c.position == 0).values(vector=b"x")
        )
    with pytest.raises(InvalidMessage):
        await index.search("apple echo")
    assert await index.search("apple echo", conversation=first, k=50) == hits
    assert await index.search("apple", conversation=new_id()) == []


async def test_search_on_an_empty_index(store: Store) -> None:
    embed = Embedder()
    index = SemanticIndex(store, embed, model=MODEL)
    assert await index.search("apple") == []
    assert embed.calls == [["apple"]]


async def test_vectors_are_unit_float32_little_endian(store: Store) -> None:
    c = new_id()
    await store.write(c, says("apple apple banana"))
    await SemanticIndex(store, Embedder(), model=MODEL).update()
    async with store.engine.connect() as conn:
        blob = (await conn.execute(select(_schema.vectors.c.vector))).scalar_one()
    stored = struct.unpack(f"<{DIMS}f", blob)
    raw = bag("apple apple banana")
    norm = math.sqrt(sum(x * x for x in raw))
    assert stored == pytest.approx([x / norm for x in raw], abs=1e-7)


async def test_approximate_gives_the_exact_results(store: Store) -> None:
    texts = await corpus(store, seed=3)
    exact = SemanticIndex(store, Embedder(), model=MODEL)
    approximate = SemanticIndex(store, Embedder(), model=MODEL, approximate=True)
    assert approximate.vector_index is None  # not looked up yet
    assert await approximate.update() == len(texts)
    assert await exact.update() == 0
    # Neither pgvector nor sqlite-vec is installed where these tests run.
    assert approximate.vector_index is None
    assert exact.vector_index is None
    for query in ["apple", "fox golf", "lima lima kilo"]:
        assert await approximate.search(query, k=7) == await exact.search(query, k=7)


# ---------------------------------------------------------------- scoped views


async def test_a_view_embeds_searches_and_deletes_only_its_own(store: Store) -> None:
    alice, bob = store.scoped("alice"), store.scoped("bob")
    mine, theirs, nobodys = new_id(), new_id(), new_id()
    await alice.write(mine, says("apple banana", "cherry"))
    await bob.write(theirs, says("apple", "apple banana"))
    await store.write(nobodys, says("apple banana"))

    embed = Embedder()
    index = SemanticIndex(alice, embed, model=MODEL)
    assert await index.update(theirs) == 0
    assert await index.update() == 2
    assert sorted(embed.seen) == ["apple banana", "cherry"]
    assert {c for c, _, _ in await vectors(store)} == {mine}

    whole = SemanticIndex(store, Embedder(), model=MODEL)
    assert await whole.update() == 3
    hits = await index.search("apple banana", k=10)
    assert {h.conversation for h in hits} == {mine}
    assert await index.search("apple", conversation=theirs) == []
    assert await index.search("apple", conversation=nobodys) == []

    await index.delete(theirs)  # not alice's: nothing happens
    await index.delete(nobodys)
    assert len(await vectors(store, theirs)) == 2
    assert len(await vectors(store, nobodys)) == 1
    await index.delete(mine)
    assert await vectors(store, mine) == []
    assert {h.conversation for h in await whole.search("apple banana", k=10)} == {
        theirs,
        nobodys,
    }


# ---------------------------------------------------------------- bad input


def nan_in_last(texts: list[str]) -> list[list[float]]:
    out = [bag(t) for t in texts]
    out[-1][0] = math.nan
    return out


BAD_OUTPUTS: dict[str, Callable[[list[str]], Any]] = {
    "too few": lambda texts: [bag(t) for t in texts][:-1],
    "too many": lambda texts: [bag(t) for t in texts] + [bag("x")],
    "nan": nan_in_last,
    "infinity": lambda texts: [[math.inf, *bag(t)[1:]] for t in texts],
    "zero vector": lambda texts: [[0.0] * DIMS for _ in texts],
    "empty vector": lambda texts: [[] for _ in texts],
    "mixed dimensions": lambda texts: [bag(t)[: DIMS - i % 2] for i, t in enumerate(texts)],
    "not numbers": lambda texts: [["a"] * DIMS for _ in texts],
    "a string": lambda texts: "vectors",
    "not a list": lambda texts: None,
}


@pytest.mark.parametrize("output", list(BAD_OUTPUTS), ids=list(BAD_OUTPUTS))
async def test_bad_embedder_output_writes_nothing(store: Store, output: str) -> None:
    c = new_id()
    await store.write(c, says("apple", "banana", "cherry"))
    index = SemanticIndex(store, Embedder(output=BAD_OUTPUTS[output]), model=MODEL)
    with pytest.raises(InvalidMessage):
        await index.update()
    assert await vectors(store) == []
    if output != "mixed dimensions":  # one query vector cannot mix dimensions
        with pytest.raises(InvalidMessage):
            await index.search("apple banana")


async def test_dimension_must_match_the_stored_vectors(store: Store) -> None:
    c = new_id()
    await store.write(c, says("apple", "banana"))
    await SemanticIndex(store, Embedder(), model=MODEL).update()
    await store.write(c, says("cherry"))
    narrow_embed = Embedder(output=lambda texts: [[1.0] * 8 for _ in texts])
    narrow = SemanticIndex(store, narrow_embed, model=MODEL)
    with pytest.raises(InvalidMessage, match="dimensions"):
        await narrow.update()
    assert len(await vectors(store)) == 2
    with pytest.raises(InvalidMessage, match="dimensions"):
        await narrow.search("apple")
    # Another model may have another dimension.
    assert await SemanticIndex(store, narrow_embed, model="narrow").update() == 3


async def test_arguments_are_checked(store: Store) -> None:
    embed = Embedder()
    for model in ["", "x" * 256, " m", None, 3]:
        with pytest.raises(InvalidId):
            SemanticIndex(store, embed, model=model)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SemanticIndex("store", embed, model=MODEL)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SemanticIndex(store, "embed", model=MODEL)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SemanticIndex(store, embed, model=MODEL, approximate=1)  # type: ignore[arg-type]
    index = SemanticIndex(store, embed, model=MODEL)
    assert index.model == MODEL
    for k, error in [(0, ValueError), (-1, ValueError), ("3", TypeError), (True, TypeError)]:
        with pytest.raises(error):
            await index.search("apple", k=k)  # type: ignore[arg-type]
    for batch, error in [(0, ValueError), (None, TypeError), (2.0, TypeError)]:
        with pytest.raises(error):
            await index.update(batch=batch)  # type: ignore[arg-type]
    for query in ["", "   ", None, b"apple"]:
        with pytest.raises(InvalidMessage):
            await index.search(query)  # type: ignore[arg-type]
    for bad in ["", " x", "a\x00b", 7]:
        with pytest.raises(InvalidId):
            await index.update(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidId):
            await index.search("apple", conversation=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidId):
            await index.delete(bad)  # type: ignore[arg-type]
    assert embed.calls == []


async def test_messages_of_every_shape_are_found(store: Store) -> None:
    c = new_id()
    await store.write(
        c,
        [
            Message.user([{"type": "text", "text": "apple banana"}]),
            {"role": "assistant", "tool_calls": [call("cherry delta")]},
            Message.tool("echo fox", tool_call_id="t1"),
        ],
    )
    index = SemanticIndex(store, Embedder(), model=MODEL)
    assert await index.update() == 3
    (hit,) = await index.search("cherry delta", k=1)
    assert hit.position == 1
    assert hit.score == pytest.approx(1.0)


def call(text: str) -> dict[str, Any]:
    return {
        "id": "t1",
        "type": "function",
        "function": {"name": "f", "arguments": f'{{"q": "{text}"}}'},
    }


# ---------------------------------------------------------------- how far an update got


def no_text(i: int) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"u{i}"}}]}


async def assert_all_embedded(store: Store, index: SemanticIndex, c: str) -> None:
    """Every message of ``c`` with text has its vector, made from the text it holds."""
    messages = await store.read(c)
    with_text = [m.position for m in messages if isinstance(m.content, str)]
    assert [p for _, p, _ in await vectors(store, c)] == with_text
    for m in messages:
        if isinstance(m.content, str):
            hits = await index.search(m.content, conversation=c, k=len(messages))
            assert any(h.position == m.position and h.score > 0.999 for h in hits)


async def test_a_conversation_update_starts_where_the_last_one_stopped(store: Store) -> None:
    c = new_id()
    await store.write(c, [*says("apple", "banana"), no_text(0), no_text(1)])
    embed = Embedder()
    index = SemanticIndex(store, embed, model=MODEL)
    assert await index.update(c, batch=1) == 2
    assert await index.update(c) == 0
    await store.write(c, [no_text(2), *says("cherry")])
    assert await index.update(c) == 1
    assert embed.seen == ["apple", "banana", "cherry"]
    k = _schema.vector_marks
    async with store.engine.connect() as conn:
        marks = (await conn.execute(select(k.c.conversation_id, k.c.model, k.c.position))).all()
    assert [tuple(r) for r in marks] == [(c, MODEL, 5)]
    await assert_all_embedded(store, index, c)


@pytest.mark.parametrize("tail", ["text", "no text"])
async def test_messages_rewritten_below_the_mark_are_embedded(store: Store, tail: str) -> None:
    c = new_id()
    first = says("apple", "banana") if tail == "text" else [no_text(0), no_text(1)]
    await store.write(c, [*says("kilo"), *first, no_text(2), *says("lima")])
    index = SemanticIndex(store, Embedder(), model=MODEL)
    await index.update(c)
    for _ in range(4):
        await store.pop(c)
    await store.write(c, says("cherry", "delta"))
    assert await index.update(c) == 2
    await assert_all_embedded(store, index, c)
    await store.clear(c)
    await store.write(c, says("echo"))
    assert await index.update(c) == 1
    await assert_all_embedded(store, index, c)


@pytest.mark.parametrize("edit", ["insert", "replace", "remove", "revert"])
async def test_edits_below_the_mark_are_embedded_again(store: Store, edit: str) -> None:
    c = new_id()
    await store.write(c, says("apple", "banana", "cherry", "delta", "echo"))
    index = SemanticIndex(store, Embedder(), model=MODEL)
    assert await index.update(c) == 5
    value = await store.edit(c)
    if edit == "insert":
        value.splice(1, 0, [Message.user("fox")], by="tester")
    elif edit == "replace":
        value.splice(2, 1, [Message.user("golf")], by="tester")
    elif edit == "remove":
        value.splice(1, 2, [], by="tester")
    if edit == "revert":
        await store.write(c, says("hotel"))
        await store.revert(c, 0, by="tester")
        await store.write(c, [no_text(0), *says("india")])
    else:
        await store.commit(value)
    await index.update(c)
    await assert_all_embedded(store, index, c)


async def test_a_mark_raised_while_messages_changed_stays_down(store: Store) -> None:
    """Messages below the end of the batch that had vectors when the update looked are
    replaced while it embeds: the update does not raise the mark over them."""
    c = new_id()
    await store.write(c, says(*(f"old {i}" for i in range(6))))
    index = SemanticIndex(store, Embedder(), model=MODEL)
    assert await index.update(c) == 6
    await store.write(c, says("new 6", "new 7"))

    async def rewrite(texts: list[str]) -> None:
        for _ in range(6):
            await store.pop(c)  # positions 2..7 go
        await store.write(c, says("new 2", "new 3", "new 4", "new 5", "new 6", "new 7"))

    racing = SemanticIndex(store, Embedder(during=rewrite), model=MODEL)
    assert await racing.update(c) == 2  # new 6 and new 7 hold the texts it read
    assert await index.update(c) == 4
    await assert_all_embedded(store, index, c)


async def test_delete_lets_a_conversation_update_start_over(store: Store) -> None:
    c = new_id()
    await store.write(c, says("apple", "banana"))
    index = SemanticIndex(store, Embedder(), model=MODEL)
    assert await index.update(c) == 2
    await index.delete(c)
    assert await index.update(c) == 2
    await assert_all_embedded(store, index, c)


async def test_an_unknown_or_foreign_conversation_gets_no_mark(store: Store) -> None:
    c = new_id()
    await store.scoped("alice").write(c, says("apple"))
    index = SemanticIndex(store, Embedder(), model=MODEL)
    assert await index.scoped("bob").update(c) == 0
    assert await index.update(new_id()) == 0
    k = _schema.vector_marks
    async with store.engine.connect() as conn:
        assert (await conn.execute(select(k.c.conversation_id))).all() == []
    assert await index.scoped("alice").update(c) == 1
