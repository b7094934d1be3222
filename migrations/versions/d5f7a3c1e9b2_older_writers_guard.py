"""Guard against older histstore processes: their writes fail, saying the schema is newer.

A process still running a histstore from before editable history (c4e8a1f2d9b7) writes
as that schema was: messages without an entry id (SQLite gave them the column's
``DEFAULT 0``, which ``changes()``, ``revert``, ``log``, export, import and copy then
refuse), a pop that shortens the conversation and deletes its last message without a
change record, a clear that leaves the new tables' rows (change records, asides, turn
records) behind for the next conversation of that id. Each of those now fails with an
error saying that the schema is newer than that histstore:

* a message stored without an entry id: SQLite, a ``BEFORE INSERT`` trigger that
  raises for an entry id below 1 (SQLite cannot change a column's default in place);
  PostgreSQL, the column's default becomes a function that raises, so only an INSERT
  that leaves the id out pays anything;
* a conversation shortened with its revision and next entry id left as they were
  (the older pop and save; histstore's own changes move the revision with the
  length): a ``BEFORE UPDATE OF length`` trigger whose condition is checked on the
  row, so histstore's own appends pay only that comparison;
* a conversation row deleted while its change records, asides or turn records remain
  (histstore deletes them first): on PostgreSQL a statement trigger over the deleted
  rows (one check per statement).

Repair: messages an older process already stored with entry id 0 get ids continuing
their conversation's ``next_entry`` (in position order). Their writes left no change
records, so the log of such a conversation cannot be traced: as c4e8a1f2d9b7 does for
a history it cannot trace, it becomes one ``save`` of all its messages at revision 1
(its earlier change records are dropped; the messages, asides and turn records stay).
Change records, asides and turn records of conversations that no longer exist are
deleted. All of it is SQL, so ``--sql`` carries it too.

Downgrading drops the guards and leaves the data as it is.

Revision ID: d5f7a3c1e9b2
Revises: c4e8a1f2d9b7
Create Date: 2026-12-02 19:30:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from histstore._storage.revisions import OLDER_WRITER_MESSAGE, placed_schema, schema_prefix

revision: str = "d5f7a3c1e9b2"
down_revision: str | None = "c4e8a1f2d9b7"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MESSAGE = OLDER_WRITER_MESSAGE
NEW_TABLES = ("histstore_changes", "histstore_asides", "histstore_turns")
ZERO_INDEX = "ix_histstore_messages_unnumbered"  # only while repairing

# The older pop (and save) shortened a conversation leaving its revision and next entry
# id as they were; histstore's own changes move the revision with the length.
SHORTENED = (
    "NEW.length < OLD.length AND NEW.revision = OLD.revision AND NEW.next_entry = OLD.next_entry"
)
SQLITE_TRIGGERS = {
    "histstore_guard_entry_id": (
        "BEFORE INSERT ON histstore_messages WHEN NEW.entry_id IS NULL OR NEW.entry_id < 1"
    ),
    "histstore_guard_pop": f"BEFORE UPDATE OF length ON histstore_conversations WHEN {SHORTENED}",
    "histstore_guard_clear": (
        "BEFORE DELETE ON histstore_conversations WHEN"
        " EXISTS (SELECT 1 FROM histstore_changes WHERE conversation_id = OLD.id)"
        " OR EXISTS (SELECT 1 FROM histstore_asides WHERE conversation_id = OLD.id)"
        " OR EXISTS (SELECT 1 FROM histstore_turns WHERE conversation_id = OLD.id)"
    ),
}

PG_NEWER = "histstore_schema_is_newer"  # the entry id's default: raises
PG_REFUSE = "histstore_refuse_older_writer"  # a trigger function: raises
PG_CLEAR = "histstore_refuse_older_clear"  # a statement trigger over the deleted rows
PG_CLEAR_CHECK = (
    "SELECT 1 FROM gone g WHERE"
    " EXISTS (SELECT 1 FROM {q}histstore_changes x WHERE x.conversation_id = g.id)"
    " OR EXISTS (SELECT 1 FROM {q}histstore_asides x WHERE x.conversation_id = g.id)"
    " OR EXISTS (SELECT 1 FROM {q}histstore_turns x WHERE x.conversation_id = g.id)"
)

# Tables (not lightweight ``table()``s), so a schema placement translates them.
ID = sa.String(length=255)
_meta = sa.MetaData()
_conversations = sa.Table(
    "histstore_conversations",
    _meta,
    sa.Column("id", ID, primary_key=True),
    sa.Column("length", sa.BigInteger),
    sa.Column("updated_at", sa.DateTime(timezone=True)),
    sa.Column("revision", sa.BigInteger),
    sa.Column("next_entry", sa.BigInteger),
)
_messages = sa.Table(
    "histstore_messages",
    _meta,
    sa.Column("conversation_id", ID, primary_key=True),
    sa.Column("position", sa.BigInteger, primary_key=True),
    sa.Column("entry_id", sa.BigInteger),
)
_writes = sa.Table(
    "histstore_writes",
    _meta,
    sa.Column("conversation_id", ID, primary_key=True),
    sa.Column("key", ID, primary_key=True),
    sa.Column("revision", sa.BigInteger),
    sa.Column("appended", sa.Integer),
)
_changes = sa.Table(
    "histstore_changes",
    _meta,
    sa.Column("conversation_id", ID, primary_key=True),
    sa.Column("revision", sa.BigInteger, primary_key=True),
    sa.Column("kind", sa.Text),
    sa.Column("author", sa.Text),
    sa.Column("at", sa.DateTime(timezone=True)),
    sa.Column("record", sa.Text),
)


def _table(name: str) -> sa.Table:
    return sa.Table(name, _meta, sa.Column("conversation_id", ID, primary_key=True))


def _whole() -> None:
    """SQLite, online: put the DDL that follows in the transaction. On a connection
    that began none itself, pysqlite begins one only at the first statement that may
    change rows, and commits DDL before it as it runs (see c4e8a1f2d9b7's downgrade);
    a later refusal must undo this step too."""
    if op.get_context().dialect.name == "sqlite" and not op.get_context().as_sql:
        op.execute("DELETE FROM histstore_changes WHERE 1 = 0")


def upgrade() -> None:
    _whole()
    _repair()
    q = schema_prefix()
    if op.get_context().dialect.name == "sqlite":
        for name, rule in SQLITE_TRIGGERS.items():
            op.execute(f"CREATE TRIGGER {name} {rule} BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END")
        return
    raised = f"RAISE EXCEPTION '{MESSAGE}' USING ERRCODE = 'P0001';"
    op.execute(
        f"CREATE FUNCTION {q}{PG_NEWER}() RETURNS bigint LANGUAGE plpgsql"
        f" AS $$ BEGIN {raised} END $$"
    )
    op.execute(
        f"ALTER TABLE {q}histstore_messages ALTER COLUMN entry_id SET DEFAULT {q}{PG_NEWER}()"
    )
    op.execute(
        f"CREATE FUNCTION {q}{PG_REFUSE}() RETURNS trigger LANGUAGE plpgsql"
        f" AS $$ BEGIN {raised} END $$"
    )
    op.execute(
        f"CREATE TRIGGER histstore_guard_pop BEFORE UPDATE OF length"
        f" ON {q}histstore_conversations FOR EACH ROW WHEN ({SHORTENED})"
        f" EXECUTE FUNCTION {q}{PG_REFUSE}()"
    )
    # ``SET search_path FROM CURRENT``: offline, the tables the body names are found
    # where the script put them (online they are named with their schema).
    op.execute(
        f"CREATE FUNCTION {q}{PG_CLEAR}() RETURNS trigger LANGUAGE plpgsql"
        " SET search_path FROM CURRENT AS $$ BEGIN"
        f" IF EXISTS ({PG_CLEAR_CHECK.format(q=q)}) THEN {raised} END IF;"
        " RETURN NULL; END $$"
    )
    op.execute(
        f"CREATE TRIGGER histstore_guard_clear AFTER DELETE ON {q}histstore_conversations"
        f" REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION {q}{PG_CLEAR}()"
    )


def _repair() -> None:
    """Number the messages an older process stored with entry id 0 and give their
    conversations one ``save`` change; drop the new tables' rows of conversations that
    are gone (see the module docstring). A partial index finds the unnumbered rows
    after one pass over the messages."""
    m, c, w, ch = _messages, _conversations, _writes, _changes
    unnumbered = m.c.entry_id < 1
    op.create_index(
        ZERO_INDEX,
        "histstore_messages",
        ["conversation_id", "position"],
        schema=placed_schema(),
        sqlite_where=sa.text("entry_id < 1"),
        postgresql_where=sa.text("entry_id < 1"),
    )
    damaged = sa.select(m.c.conversation_id).where(unnumbered).distinct()
    op.execute(sa.delete(ch).where(ch.c.conversation_id.in_(damaged)))
    op.execute(
        sa.update(w).where(w.c.conversation_id.in_(damaged)).values(revision=None, appended=None)
    )
    added = sa.cast(c.c.length, sa.Text())
    record = sa.literal('{"start":0,"added":', sa.Text()) + added + sa.literal("}", sa.Text())
    saves = sa.select(
        c.c.id,
        sa.literal(1, sa.BigInteger()),
        sa.literal("save", sa.Text()),
        sa.null(),
        c.c.updated_at,
        record,
    ).where(c.c.id.in_(damaged), c.c.length > 0)
    columns = ["conversation_id", "revision", "kind", "author", "at", "record"]
    op.execute(sa.insert(ch).from_select(columns, saves))
    count = (
        sa.select(sa.func.count())
        .where(m.c.conversation_id == c.c.id, unnumbered)
        .scalar_subquery()
    )
    op.execute(
        sa.update(c)
        .where(c.c.id.in_(damaged))
        .values(
            next_entry=c.c.next_entry + count,
            revision=sa.case((c.c.length > 0, 1), else_=0),
        )
    )
    # next_entry has grown by the count: the ids run from its old value on.
    zero = m.alias("zero")
    part = {"partition_by": zero.c.conversation_id}
    ranked = (
        sa.select(
            zero.c.conversation_id,
            zero.c.position,
            (
                c.c.next_entry
                - sa.func.count().over(**part)
                + sa.func.row_number().over(**part, order_by=zero.c.position)
                - 1
            ).label("eid"),
        )
        .join(c, c.c.id == zero.c.conversation_id)
        .where(zero.c.entry_id < 1)
        .subquery("ranked")
    )
    op.execute(
        sa.update(m)
        .where(
            m.c.conversation_id == ranked.c.conversation_id,
            m.c.position == ranked.c.position,
        )
        .values(entry_id=ranked.c.eid)
    )
    op.drop_index(
        ZERO_INDEX,
        table_name="histstore_messages",
        schema=placed_schema(),
        sqlite_where=sa.text("entry_id < 1"),
        postgresql_where=sa.text("entry_id < 1"),
    )
    for name in NEW_TABLES:
        t = _meta.tables[name] if name in _meta.tables else _table(name)
        gone = ~sa.exists().where(c.c.id == t.c.conversation_id)
        op.execute(sa.delete(t).where(gone))


def downgrade() -> None:
    _whole()
    q = schema_prefix()
    if op.get_context().dialect.name == "sqlite":
        for name in SQLITE_TRIGGERS:
            op.execute(f"DROP TRIGGER {name}")
        return
    for name in ("histstore_guard_pop", "histstore_guard_clear"):
        op.execute(f"DROP TRIGGER {name} ON {q}histstore_conversations")
    op.execute(f"DROP FUNCTION {q}{PG_CLEAR}()")
    op.execute(f"DROP FUNCTION {q}{PG_REFUSE}()")
    op.execute(f"ALTER TABLE {q}histstore_messages ALTER COLUMN entry_id DROP DEFAULT")
    op.execute(f"DROP FUNCTION {q}{PG_NEWER}()")
