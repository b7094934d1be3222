"""histstore: conversation history for LLM agents, kept in SQL.

One async implementation on SQLAlchemy 2 runs on an embedded SQLite file (aiosqlite)
and on PostgreSQL (asyncpg); Alembic migrations own the schema. Start with
``histstore.connect()``.
"""

from . import turns as turns
from ._connect import connect as connect
from ._core.ids import validate_id as validate_id
from ._core.models import ConversationState as ConversationState
from ._core.models import Message as Message
from ._core.models import Summary as Summary
from ._core.models import WriteOutcome as WriteOutcome
from ._core.search_text import Hit as Hit
from ._core.search_text import indexed_text as indexed_text
from ._editable.changes import Change as Change
from ._editable.conversation import Conversation as Conversation
from ._editable.entries import Aside as Aside
from ._editable.entries import Entry as Entry
from ._editable.entries import Spliced as Spliced
from ._editable.entries import TurnRecord as TurnRecord
from ._errors import CommitError as CommitError
from ._errors import ConflictError as ConflictError
from ._errors import HistStoreError as HistStoreError
from ._errors import InvalidId as InvalidId
from ._errors import InvalidMessage as InvalidMessage
from ._errors import NotFound as NotFound
from ._errors import SchemaError as SchemaError
from ._errors import WindowTooSmall as WindowTooSmall
from ._errors import WriteError as WriteError
from ._ops.semantic import SemanticIndex as SemanticIndex
from ._storage.dberrors import DatabaseFailure as DatabaseFailure
from ._storage.diagnostics import Diagnostics as Diagnostics
from ._store import Store as Store
from .compaction import compact as compact
from .middleware import with_history as with_history
from .window import WindowStore as WindowStore

__version__ = "0.1.0"

__all__ = [
    "Aside",
    "Change",
    "CommitError",
    "ConflictError",
    "Conversation",
    "ConversationState",
    "DatabaseFailure",
    "Diagnostics",
    "Entry",
    "HistStoreError",
    "Hit",
    "InvalidId",
    "InvalidMessage",
    "Message",
    "NotFound",
    "SchemaError",
    "SemanticIndex",
    "Spliced",
    "Store",
    "Summary",
    "TurnRecord",
    "WindowStore",
    "WindowTooSmall",
    "WriteError",
    "WriteOutcome",
    "compact",
    "connect",
    "indexed_text",
    "turns",
    "validate_id",
    "with_history",
]
