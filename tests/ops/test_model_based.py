"""A model of SPEC 4-5: random operation sequences leave the store equal to a dict model.

Each example runs a generated list of writes (with and without ``at=``), pops, metadata
merges, list appends, forks and clears on a few conversation ids, checks every call's
answer against the model, and then compares everything the store holds with it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import histstore
from histstore import ConflictError, NotFound, WriteOutcome

Store = histstore.Store

IDS = ("a", "b", "c")
KEYS = ("k1", "k2", "k3")
LISTS = ("l1", "l2")

ids = st.sampled_from(IDS)
# ``at``/``upto`` are drawn relative to the conversation's length when the operation runs
# (see ``resolve``), so that retries, overlaps, gaps and prefixes all come up often.
offsets = st.none() | st.integers(-3, 1)
# Few distinct messages, so that retried writes with at= often confirm stored ones.
messages = st.lists(
    st.builds(lambda r, c: {"role": r, "content": c}, st.sampled_from(["user", "assistant"]),
              st.sampled_from(["x", "y"])),
    min_size=1,
    max_size=3,
)  # fmt: skip
items = st.integers(0, 3) | st.binary(max_size=2) | st.lists(st.none(), max_size=1)
updates = st.dictionaries(
    st.sampled_from(KEYS),
    st.none() | st.integers(0, 2) | st.text(max_size=2),
    min_size=1,
    max_size=3,
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("write"), ids, messages, offsets),
        # A write that starts k messages back with those very messages, then goes on
        # (a retried or resumed write: the overlap is confirmed, the rest appended).
        st.tuples(st.just("resume"), ids, st.integers(1, 3), messages | st.just([])),
        st.tuples(st.just("pop"), ids),
        st.tuples(st.just("merge"), ids, updates),
        st.tuples(st.just("merge"), ids, updates),
        st.tuples(
            st.just("append"),
            ids,
            st.sampled_from(LISTS),
            st.lists(items, max_size=3),
        ),
        st.tuples(st.just("fork"), ids, ids, offsets),
        st.tuples(st.just("fork"), ids, ids, offsets),  # forks and clears twice as often
        st.tuples(st.just("clear"), ids),
        st.tuples(st.just("clear"), ids),
    ),
    min_size=8,
    max_size=25,
)  # fmt: skip


@dataclass
class Conv:
    messages: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    lists: dict[str, list[Any]] = field(default_factory=dict)

    def copy(self, upto: int | None) -> Conv:
        return Conv(
            list(self.messages[:upto]),
            dict(self.metadata),
            {k: list(v) for k, v in self.lists.items()},
        )


class Model:
    """The SPEC's semantics over plain dicts. Returns what the store must return (or raises)."""

    def __init__(self) -> None:
        self.convs: dict[str, Conv] = {}

    def write(self, c: str, batch: list[dict[str, Any]], at: int | None) -> WriteOutcome:
        conv = self.convs.get(c)
        stored = conv.messages if conv else []
        first = len(stored) if at is None else at
        if first > len(stored):
            raise ConflictError("gap")
        overlap = min(len(stored) - first, len(batch))
        if stored[first : first + overlap] != batch[:overlap]:
            raise ConflictError("differs")
        conv = self.convs.setdefault(c, Conv())
        conv.messages.extend(batch[overlap:])
        return WriteOutcome(len(batch), False, len(conv.messages))

    def pop(self, c: str) -> dict[str, Any] | None:
        conv = self.convs.get(c)
        return conv.messages.pop() if conv and conv.messages else None

    def merge(self, c: str, updates: dict[str, Any]) -> None:
        meta = self.convs.setdefault(c, Conv()).metadata
        for k, v in updates.items():
            if v is None:
                meta.pop(k, None)
            else:
                meta[k] = v

    def append(self, c: str, name: str, items: list[Any]) -> int:
        lst = self.convs.setdefault(c, Conv()).lists.setdefault(name, [])
        lst.extend(items)
        return len(lst)

    def fork(self, src: str, tgt: str, upto: int | None) -> None:
        if src not in self.convs:
            raise NotFound(src)
        if tgt in self.convs:
            raise ConflictError(tgt)
        self.convs[tgt] = self.convs[src].copy(upto)

    def clear(self, c: str) -> None:
        self.convs.pop(c, None)


def resolve(model: Model, op: tuple[Any, ...]) -> tuple[Any, ...]:
    """Turn relative positions into absolute ones, and ``resume`` into a ``write``."""
    conv = model.convs.get(op[1])
    stored = conv.messages if conv else []
    if op[0] == "resume":
        _, c, back, more = op
        at = max(0, len(stored) - back)
        batch = [*stored[at:], *more] or [{"role": "user", "content": "x"}]
        return ("write", c, batch, at)
    if op[0] not in ("write", "fork") or op[-1] is None:
        return op
    return (*op[:-1], max(0, len(stored) + op[-1]))


async def apply(store: Store, op: tuple[Any, ...], name: dict[str, str]) -> Any:
    kind, *args = op
    if kind == "write":
        c, batch, at = args
        return await store.write(name[c], batch, at=at)
    if kind == "pop":
        m = await store.pop(name[args[0]])
        return None if m is None else m.to_dict()
    if kind == "merge":
        return await store.merge_metadata(name[args[0]], args[1])
    if kind == "append":
        return await store.list_append(name[args[0]], args[1], args[2])
    if kind == "fork":
        return await store.fork(name[args[0]], name[args[1]], upto=args[2])
    assert kind == "clear"
    return await store.clear(name[args[0]])


def expect(model: Model, op: tuple[Any, ...]) -> Any:
    kind, *args = op
    return getattr(model, kind)(*args)


async def check_equal(store: Store, model: Model, name: dict[str, str], prefix: str) -> None:
    listed = [c for c in await store.conversations() if c.startswith(prefix)]
    assert listed == sorted(name[c] for c in model.convs)
    for c in IDS:
        conv = model.convs.get(c)
        sid = name[c]
        assert await store.exists(sid) == (conv is not None)
        stored = await store.read(sid)
        assert [m.to_dict() for m in stored] == (conv.messages if conv else [])
        assert [m.position for m in stored] == list(range(len(stored)))
        assert await store.count(sid) == len(stored)
        if conv is None:
            for call in (store.metadata(sid), store.list_len(sid, LISTS[0])):
                try:
                    await call
                except NotFound:
                    continue
                raise AssertionError(f"{c} should be unknown")
            continue
        assert await store.metadata(sid) == conv.metadata
        for lst in LISTS:
            assert await store.list_load(sid, lst) == conv.lists.get(lst, [])
            assert await store.list_len(sid, lst) == len(conv.lists.get(lst, []))


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=operations)
async def test_random_operations_match_the_model(store: Store, ops: list[tuple[Any, ...]]) -> None:
    prefix = f"mb-{uuid.uuid4().hex}-"  # the store outlives examples: fresh ids each time
    name = {c: prefix + c for c in IDS}
    model = Model()
    for raw in ops:
        op = resolve(model, raw)
        try:
            want: Any = expect(model, op)
        except (ConflictError, NotFound) as exc:
            try:
                await apply(store, op, name)
            except type(exc):
                pass
            else:
                raise AssertionError(f"{op} should raise {type(exc).__name__}") from None
        else:
            got = await apply(store, op, name)
            assert got == want, op
    await check_equal(store, model, name, prefix)
