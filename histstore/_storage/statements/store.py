"""Every statement the store's programs run, compiled once per engine and kind of store.

They are SQLAlchemy Core statements with named bind parameters: ``c`` (a conversation
id), ``owner`` (a scoped view's user; a whole store passes ``None`` and its statements
carry no owner condition) and per statement the rest. Ownership is decided here, in
one place: with ``scoped`` every statement that names a conversation only sees the
view's user's conversations, and every statement that creates one makes it theirs.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    and_,
    bindparam,
    delete,
    exists,
    func,
    literal_column,
    null,
    select,
    tuple_,
    update,
)

from .. import schema as s
from ..drivers import Driver
from ..rows import CLAIMED
from . import appends as _appends
from . import dialects as _dialects
from . import search as _search
from .editing import EditStatements
from .grouped_reads import read_group_statement
from .thread_search import thread_search

__all__ = ["Statements"]

_conv = s.conversations
_msg = s.messages
_writes = s.writes
# A literal, so SQLite can use the partial index of system messages.
_SYSTEM: ColumnElement[str] = literal_column("'system'")


class Statements:
    """The compiled statements of a whole store (``scoped=False``) or of a user's view."""

    def __init__(self, driver: Driver, scoped: bool) -> None:
        dialect = driver.dialect
        compile_ = driver.compile
        self.edit = EditStatements(driver, scoped)
        conv_id = bindparam("c", type_=_conv.c.id.type)
        owner = bindparam("owner", type_=_conv.c.owner.type)
        owned: ColumnElement[bool] = _conv.c.id == conv_id
        if scoped:
            owned = and_(owned, _conv.c.owner == owner)
        mine = (_conv.c.owner == owner) if scoped else None
        now = bindparam("now", type_=_conv.c.updated_at.type)

        # ---------------------------------------------------------------- reads
        self.count = compile_(select(_conv.c.length).where(owned))
        self.exists = compile_(select(_conv.c.id).where(owned))
        self.created_at = driver.result_processor(_msg.c.created_at.type)
        # What a message read back carries (``History.messages``, its time by ``read_time``).
        cols = _dialects.message_columns(dialect)
        self.read_time = _dialects.message_time(dialect, self.created_at)
        base = [_msg.c.conversation_id == conv_id, _msg.c.position >= bindparam("start")]
        if scoped:
            base.append(exists().where(owned))
        upto = _msg.c.position < bindparam("stop")
        limit = bindparam("limit", type_=Integer)
        newest = _msg.c.position.desc()
        self.read = {
            (False, False): compile_(select(*cols).where(*base).order_by(_msg.c.position)),
            (False, True): compile_(select(*cols).where(*base, upto).order_by(_msg.c.position)),
            (True, False): compile_(select(*cols).where(*base).order_by(newest).limit(limit)),
            (True, True): compile_(select(*cols).where(*base, upto).order_by(newest).limit(limit)),
        }
        system = [_msg.c.conversation_id == conv_id, _msg.c.role == _SYSTEM, *base[2:]]
        self.read_system = compile_(select(*cols).where(*system).order_by(_msg.c.position))

        # ---------------------------------------------------------------- the conversation row
        n = bindparam("n", type_=BigInteger)
        ins = _dialects.insert(dialect, _conv).values(
            id=conv_id, owner=owner, length=n, created_at=now, updated_at=now
        )
        # An append is a change record: the conversation's revision grows by one, the
        # batch takes the next entry ids, and the halt is cleared (SPEC 11).
        appended = {
            "revision": _conv.c.revision + s.ONE,
            **s.LISTED_CHANGE,
            "next_entry": _conv.c.next_entry + n,
            "halted": null(),
            "updated_at": now,
        }
        grown = (_conv.c.length, _conv.c.revision, _conv.c.next_entry)
        # Creates the conversation or adds n to its length, locking its row; returns the
        # new length, revision and next entry id (the batch goes at positions length-n ..
        # length-1, entry ids next_entry-n ..), or nothing when a view may not see it.
        self.append = compile_(
            ins.values(revision=s.ONE, next_entry=n + s.ONE, listed_changes=s.ONE)
            .on_conflict_do_update(
                index_elements=[_conv.c.id],
                set_={"length": _conv.c.length + n, **appended},
                where=mine,
            )
            .returning(*grown)
        )
        # Postgres only (``None`` elsewhere): the one-statement append, its group form
        # and the grouped read (``_storage.append_groups``, ``_storage.read_groups``).
        self.append_one, self.append_group, self.read_group = (
            None if g is None else compile_(g)
            for g in (
                _appends.append_in_one_statement(dialect, scoped),
                _appends.append_group_statement(dialect, scoped),
                read_group_statement(dialect, scoped),
            )
        )
        # Appends only when the conversation holds exactly ``at`` messages.
        self.append_at = compile_(
            update(_conv)
            .where(owned, _conv.c.length == bindparam("at", type_=BigInteger))
            .values(length=bindparam("new_length", type_=BigInteger), **appended)
            .returning(*grown)
        )
        # Creates the conversation or marks it changed, locking its row; returns its
        # length, revision and next entry id, or nothing when a view may not see it.
        self.touch = compile_(
            ins.values(length=0)
            .on_conflict_do_update(
                index_elements=[_conv.c.id], set_={"updated_at": now}, where=mine
            )
            .returning(*grown)
        )
        # Appends n messages after a ``touch`` (the row is locked), as ``append``.
        self.set_length = compile_(
            update(_conv)
            .where(_conv.c.id == conv_id)
            .values(length=bindparam("length", type_=BigInteger), **appended)
        )
        # Locks a row that exists and is visible; returns its length and owner.
        self.lock = compile_(
            _dialects.for_update(
                dialect,
                select(
                    _conv.c.length, _conv.c.owner, _conv.c.system_prompt, _conv.c.next_entry
                ).where(owned),
            )
        )
        # Whether the id is taken at all (by anyone): tells NotFound from ConflictError.
        self.taken = compile_(select(_conv.c.owner).where(_conv.c.id == conv_id))
        # Creates a conversation that must not exist yet (fork, import); returns its id.
        self.create = compile_(
            _dialects.insert(dialect, _conv)
            .values(
                id=conv_id,
                owner=owner,
                system_prompt=bindparam("system_prompt", type_=_conv.c.system_prompt.type),
                length=n,
                revision=bindparam("revision", 0, type_=BigInteger),
                next_entry=bindparam("next_entry", 1, type_=BigInteger),
                listed_changes=1,
                created_at=bindparam("created_at", type_=_conv.c.created_at.type),
                updated_at=bindparam("updated_at", type_=_conv.c.updated_at.type),
            )
            .on_conflict_do_nothing(index_elements=[_conv.c.id])
            .returning(_conv.c.id)
        )
        self.replace_row = compile_(
            update(_conv)
            .where(_conv.c.id == conv_id)
            .values(
                owner=owner,
                system_prompt=bindparam("system_prompt", type_=_conv.c.system_prompt.type),
                length=n,
                revision=bindparam("revision", type_=BigInteger),
                next_entry=bindparam("next_entry", type_=BigInteger),
                halted=None,
                **s.LISTED_CHANGE,
                created_at=func.coalesce(
                    bindparam("created_at", type_=_conv.c.created_at.type), _conv.c.created_at
                ),
                updated_at=bindparam("updated_at", type_=_conv.c.updated_at.type),
            )
        )

        # ---------------------------------------------------------------- messages
        self.insert_messages = compile_(_msg.insert())
        self.listed = _search.ListedInserts(compile_, dialect)  # wraps every insert of messages
        self.insert_write = compile_(_writes.insert())
        # For a caller's key: returns nothing when the key is already recorded; takes
        # the place of the key's claim (a lost write settled as not stored).
        record = _dialects.insert(dialect, _writes)
        the_key = ["conversation_id", "key"]
        claimed: ColumnElement[str] = literal_column(f"'{CLAIMED}'")
        self.insert_write_once = compile_(
            record.on_conflict_do_update(
                index_elements=the_key,
                set_={c.name: record.excluded[c.name] for c in _writes.c if c.name not in the_key},
                where=_writes.c.digest == claimed,
            ).returning(_writes.c.key)
        )
        self.find_write = compile_(
            select(_writes.c.digest, _writes.c.count, _writes.c.position).where(
                _writes.c.conversation_id == conv_id, _writes.c.key == bindparam("key")
            )
        )
        self.stored_range = compile_(
            select(_msg.c.data, _msg.c.position)
            .where(
                _msg.c.conversation_id == conv_id,
                _msg.c.position >= bindparam("start", type_=BigInteger),
                _msg.c.position < bindparam("stop", type_=BigInteger),
            )
            .order_by(_msg.c.position)
        )
        self.delete_message = compile_(
            delete(_msg)
            .where(
                _msg.c.conversation_id == conv_id,
                _msg.c.position == bindparam("position", type_=BigInteger),
            )
            .returning(*_dialects.message_columns(None))  # times as stored: ``created_at``
        )
        # Settling a write whose commit was lost (``_ops.settle``), in one transaction:
        # bound its lock waits, take the row lock (``lock``), claim the key (nothing
        # returned when a row holds it already), else read the row's digest (``CLAIMED``
        # or the batch's) and the conversation's length.
        patience = _dialects.lock_patience(dialect)
        self.lock_patience = None if patience is None else compile_(patience)
        self.claim_key = compile_(
            _dialects.insert(dialect, _writes)
            .values(
                conversation_id=conv_id,
                key=bindparam("key", type_=_writes.c.key.type),
                position=literal_column("0"),
                count=literal_column("0"),
                digest=claimed,
                created_at=now,
            )
            .on_conflict_do_nothing(index_elements=the_key)
            .returning(_writes.c.key)
        )
        self.settled = compile_(
            select(_writes.c.digest, _conv.c.length)
            .select_from(_writes.outerjoin(_conv, _conv.c.id == _writes.c.conversation_id))
            .where(_writes.c.conversation_id == conv_id, _writes.c.key == bindparam("key"))
        )

        # ---------------------------------------------------------------- whole conversations
        # Children first, the conversation row last (clear, purge, replacing on import).
        self.delete_children = [
            compile_(delete(t).where(t.c.conversation_id == conv_id)) for t in s.CONVERSATION_TABLES
        ]
        self.delete_conversation = compile_(delete(_conv).where(_conv.c.id == conv_id))
        bulk = _dialects.delete_listed_in_rowid_order(dialect, _msg)  # purge's batches (SQLite)
        self.delete_listed_messages = None if bulk is None else compile_(bulk)
        # save replaces these and keeps lists.
        self.delete_saved = [
            compile_(delete(t).where(t.c.conversation_id == conv_id))
            for t in (_msg, _writes, s.summaries, s.metadata_entries)
        ]
        src = bindparam("src", type_=_conv.c.id.type)
        upto_ = bindparam("upto", type_=BigInteger)
        self.fork_copies = []
        for table, cond in (
            (_msg, _msg.c.position < upto_),
            (s.summaries, s.summaries.c.end < bindparam("upto_summary", type_=BigInteger)),
            (s.metadata_entries, None),
            (s.lists, None),
            (s.list_items, None),
        ):
            other = [c for c in table.c if c.name != "conversation_id"]
            where: ColumnElement[bool] = table.c.conversation_id == src
            if cond is not None:
                where = and_(where, cond)
            sel = select(conv_id, *other).where(where)
            names = ["conversation_id", *[c.name for c in other]]
            self.fork_copies.append(compile_(table.insert().from_select(names, sel)))
        idle_since = bindparam("cutoff", type_=_conv.c.updated_at.type)
        idle: ColumnElement[bool] = _conv.c.updated_at < idle_since
        if scoped:
            idle = and_(idle, _conv.c.owner == owner)
        # Purge's batches walk the (owner,) updated_at, id index, each after the last one
        # picked: none passes over deleted entries (Postgres keeps them until a vacuum).
        picked = select(_conv.c.id, _conv.c.updated_at).order_by(_conv.c.updated_at, _conv.c.id)
        picked = picked.limit(bindparam("batch", type_=Integer))
        after = tuple_(_conv.c.updated_at, _conv.c.id) > tuple_(
            bindparam("after_at", type_=_conv.c.updated_at.type),
            bindparam("after_id", type_=_conv.c.id.type),
        )
        self.pick_idle, self.pick_idle_after = (
            compile_(_dialects.for_update(dialect, picked.where(*where)))
            for where in ([idle], [idle, after])
        )

        # ---------------------------------------------------------------- state
        md, lists = s.metadata_entries, s.lists
        md_ins = _dialects.insert(dialect, md)
        self.set_metadata = compile_(
            md_ins.on_conflict_do_update(
                index_elements=[md.c.conversation_id, md.c.key_digest],
                set_={"value": md_ins.excluded.value, "digest": md_ins.excluded.digest},
            )
        )
        # By the key's digest (``_core.rules.metadata_key_digest``), as every lookup by key.
        self.delete_metadata = compile_(
            delete(md).where(
                md.c.conversation_id == conv_id,
                md.c.key_digest == bindparam("key_digest", type_=md.c.key_digest.type),
            )
        )
        self.insert_metadata = compile_(md.insert())
        # A conversation's metadata in one statement: no row when it is unknown (or not
        # visible), one row with a NULL key when it has none.
        self.read_metadata = compile_(
            select(md.c.key, md.c.value)
            .select_from(_conv.outerjoin(md, md.c.conversation_id == _conv.c.id))
            .where(owned)
            .order_by(md.c.key)
        )
        k = bindparam("k", type_=BigInteger)
        # Creates the list or adds k to its length; returns the new length.
        self.grow_list = compile_(
            _dialects.insert(dialect, lists)
            .values(
                conversation_id=conv_id, name=bindparam("name", type_=lists.c.name.type), length=k
            )
            .on_conflict_do_update(
                index_elements=[lists.c.conversation_id, lists.c.name],
                set_={"length": lists.c.length + k},
            )
            .returning(lists.c.length)
        )
        self.insert_list = compile_(lists.insert())
        self.insert_list_items = compile_(s.list_items.insert())
        # ---------------------------------------------------------------- leases
        le = s.leases
        clock = _dialects.clock(dialect)
        holder = bindparam("holder", type_=le.c.holder.type)
        until = clock + bindparam("ttl", type_=le.c.expires_at.type)
        le_ins = _dialects.insert(dialect, le).values(id=conv_id, holder=holder, expires_at=until)
        # Takes the lease when it is free or expired; returns the holder when taken.
        self.take_lease = compile_(
            le_ins.on_conflict_do_update(
                index_elements=[le.c.id],
                set_={"holder": le_ins.excluded.holder, "expires_at": le_ins.excluded.expires_at},
                where=le.c.expires_at <= clock,
            ).returning(le.c.holder)
        )
        mine_ = and_(le.c.id == conv_id, le.c.holder == holder)
        self.renew_lease = compile_(
            update(le)
            .where(mine_, le.c.expires_at > clock)
            .values(expires_at=until)
            .returning(le.c.holder)
        )
        self.release_lease = compile_(delete(le).where(mine_))
        # Seconds until the current lease expires (none when free or expired).
        self.lease_left = compile_(
            select(le.c.expires_at - clock).where(le.c.id == conv_id, le.c.expires_at > clock)
        )

        sm = s.summaries
        self.next_summary = compile_(
            select(func.coalesce(func.max(sm.c.seq) + 1, 0)).where(sm.c.conversation_id == conv_id)
        )
        self.insert_summary = compile_(sm.insert())

        # ---------------------------------------------------------------- transfer
        # Import and copy make a conversation equal to an incoming one, writing only
        # what differs: they lock it, read what it holds range by range, and cut it
        # from the first difference on.
        self.lock_whole = compile_(
            _dialects.for_update(
                dialect,
                select(
                    _conv.c.owner,
                    _conv.c.system_prompt,
                    _conv.c.length,
                    _conv.c.created_at,
                    _conv.c.updated_at,
                    _conv.c.next_entry,
                    _conv.c.revision,
                    _conv.c.next_aside,
                    _conv.c.halted,
                ).where(owned),
            )
        )
        start = bindparam("start", type_=BigInteger)
        stop = bindparam("stop", type_=BigInteger)
        self.message_rows = compile_(
            select(
                _msg.c.position,
                _msg.c.data,
                _msg.c.token_count,
                _msg.c.created_at,
                _msg.c.entry_id,
                _msg.c.author,
            )
            .where(_msg.c.conversation_id == conv_id, _msg.c.position >= start)
            .where(_msg.c.position < stop)
            .order_by(_msg.c.position)
        )
        self.delete_messages_from = compile_(
            delete(_msg).where(_msg.c.conversation_id == conv_id, _msg.c.position >= start)
        )
        self.delete_writes = compile_(delete(_writes).where(_writes.c.conversation_id == conv_id))
        self.summary_rows = compile_(
            select(sm.c.start, sm.c.end, sm.c.content, sm.c.token_count, sm.c.created_at)
            .where(sm.c.conversation_id == conv_id)
            .order_by(sm.c.seq)
        )
        self.delete_summaries = compile_(delete(sm).where(sm.c.conversation_id == conv_id))
        self.metadata_rows = compile_(
            select(md.c.key, md.c.value).where(md.c.conversation_id == conv_id)
        )
        self.delete_all_metadata = compile_(delete(md).where(md.c.conversation_id == conv_id))
        li, name = s.list_items, bindparam("name", type_=lists.c.name.type)
        self.list_rows = compile_(
            select(lists.c.name, lists.c.length).where(lists.c.conversation_id == conv_id)
        )
        self.set_list_length = compile_(
            update(lists)
            .where(lists.c.conversation_id == conv_id, lists.c.name == name)
            .values(length=k)
        )
        self.delete_list = compile_(
            delete(lists).where(lists.c.conversation_id == conv_id, lists.c.name == name)
        )
        self.item_rows = compile_(
            select(li.c.idx, li.c.value, li.c.blob)
            .where(li.c.conversation_id == conv_id, li.c.name == name, li.c.idx >= start)
            .where(li.c.idx < stop)
            .order_by(li.c.idx)
        )
        self.delete_items_from = compile_(
            delete(li).where(li.c.conversation_id == conv_id, li.c.name == name, li.c.idx >= start)
        )
        # A batch of one conversation's messages in one statement (Postgres's arrays).
        arrays = _dialects.messages_from_arrays(dialect)
        self.insert_message_arrays = None if arrays is None else compile_(arrays)

        # ---------------------------------------------------------------- search
        found = _search.SearchStatements(compile_, dialect, scoped, owner)
        self.search, self.search_unlisted, self.text = found.search, found.unlisted, found.text
        self.reindex_page, self.set_indexed = found.reindex_page, found.set_indexed
        self.thread_search = compile_(thread_search(dialect, scoped))
