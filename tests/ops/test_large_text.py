"""Large messages and the full-text index (SPEC 12): a message is stored whole whatever
its size, and search covers the first ``SEARCH_TEXT_BYTES`` bytes of its text, the same
on every backend (PostgreSQL's ``tsvector`` holds at most 1 MiB)."""

from __future__ import annotations

import random

import pytest

import histstore.admin
from histstore import Message, Store
from histstore._storage.rows import SEARCH_TEXT_BYTES, searchable

N = SEARCH_TEXT_BYTES


def _filler(size: int) -> str:
    """``size`` bytes of a few words over and over (ASCII)."""
    unit = "lorem ipsum dolor sit amet "
    return (unit * (size // len(unit) + 1))[:size]


def _distinct_words(size: int, seed: int, alphabet: str) -> str:
    """About ``size`` bytes of distinct short words drawn from ``alphabet``: the text
    whose ``tsvector`` is largest for its size (every word a lexeme of its own)."""
    rnd = random.Random(seed)
    seen: set[str] = set()
    out: list[str] = []
    total = 0
    length = 1
    while total < size:
        for _ in range(50):
            w = "".join(rnd.choice(alphabet) for _ in range(length))
            if w not in seen:
                break
        else:
            length += 1
            continue
        seen.add(w)
        out.append(w)
        total += len(w.encode()) + 1
    return " ".join(out)


async def test_a_35_mb_message_is_stored_whole_and_found_by_its_first_part(
    store: Store, cid: str
) -> None:
    head = "zebracorn " + _filler(N // 2)
    tail = " " + _filler(3_500_000 - len(head) - 20) + " quokkalast"
    big = Message.user(head + tail)
    assert len(big.content.encode()) > 3_400_000  # type: ignore[union-attr]
    await store.write(cid, [Message.user("small one"), big])

    got = await store.read(cid)
    assert [m.content for m in got] == ["small one", big.content]
    hits = await store.search("zebracorn", conversation=cid)
    assert [(h.position, h.message.content) for h in hits] == [(1, big.content)]
    # A word only after the first N bytes is not indexed.
    assert await store.search("quokkalast", conversation=cid) == []


async def test_the_cut_is_on_a_character_boundary_at_n_bytes(store: Store, cid: str) -> None:
    # Multi-byte characters straddle the cut; the word ending right before it is found,
    # the one right after it is not.
    before = "é" * ((N - 20) // 2)
    text = before + " boundaryword " + "€" * 40 + " afterword " + "x" * 1000
    cut = searchable(text)
    assert cut is not None
    assert len(cut.encode()) <= N
    assert text.startswith(cut)
    assert len(cut.encode()) > N - 4  # only the straddling character is left out
    await store.write(cid, [Message.user(text)])
    assert [h.position for h in await store.search("boundaryword", conversation=cid)] == [0]
    assert await store.search("afterword", conversation=cid) == []
    assert (await store.read(cid))[0].content == text


@pytest.mark.parametrize(
    "alphabet",
    [
        pytest.param("abcdefghijklmnopqrstuvwxyz0123456789", id="ascii"),
        pytest.param("".join(chr(c) for c in range(0x430, 0x450)), id="cyrillic"),
        pytest.param("".join(chr(c) for c in range(0x4E00, 0x4E00 + 3000)), id="cjk"),
        pytest.param("ȺȾ" + "".join(chr(c) for c in range(0x3B1, 0x3CA)), id="lowercase-grows"),
    ],
)
async def test_the_worst_case_text_fits_the_index(store: Store, cid: str, alphabet: str) -> None:
    # N bytes of distinct short words, then a marker word: stored, found by its first
    # words; on PostgreSQL this is the text whose tsvector is largest.
    text = _distinct_words(N + 50_000, seed=len(alphabet), alphabet=alphabet)
    first = text.split(" ", 1)[0]
    await store.write(cid, [Message.user(text + " farbeyondword")])
    assert [h.position for h in await store.search(first, conversation=cid)] == [0]
    assert await store.search("farbeyondword", conversation=cid) == []


async def test_edits_and_copies_keep_large_messages_storable(store: Store, cid: str) -> None:
    big = "needleword " + _filler(1_500_000) + " hiddenword"
    await store.write(cid, [Message.user("a")])
    conv = await store.edit(cid)
    conv.splice(0, 1, [Message.user(big)], by="test")
    await store.commit(conv)
    assert (await store.read(cid))[0].content == big
    assert [h.position for h in await store.search("needleword", conversation=cid)] == [0]
    assert await store.search("hiddenword", conversation=cid) == []
    await store.revert(cid, 1, by="test")
    await store.revert(cid, 2, by="test")
    assert (await store.read(cid))[0].content == big
    assert [h.position for h in await store.search("needleword", conversation=cid)] == [0]


def test_searchable_leaves_short_text_alone() -> None:
    assert searchable(None) is None
    assert searchable("") == ""
    short = "ü" * (N // 2)  # N bytes exactly
    assert searchable(short) == short
    assert searchable(short + "a") == short
    assert searchable("\ud800" * N) == "\ud800" * (N // 3)  # lone surrogates survive


async def test_reindex_keeps_the_cut(store: Store, cid: str) -> None:
    text = "startword " + _filler(N + 10_000) + " endword"
    await store.write(cid, [Message.user(text)])
    assert await histstore.admin.reindex(store) == 0
    assert [h.position for h in await store.search("startword", conversation=cid)] == [0]
    assert await store.search("endword", conversation=cid) == []
