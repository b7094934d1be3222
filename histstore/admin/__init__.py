"""Administration: figures, listings and transfers for operators and tools.

Everything here takes a ``Store`` and sees what it sees: through a scoped view
(``store.scoped(user)``) only that user's conversations. The ``histstore`` command is
built on this module and the rest of the public API only.

::

    from .. import admin

    async with histstore.connect("chat.db") as store:
        print((await admin.stats(store)).as_dict())
        for info in await admin.list_conversations(store, since=yesterday, order="updated"):
            print(info.id, info.length)
        with open("dump.jsonl", "w") as out:
            await admin.export_store(store.scoped("alice"), out)

Migrations: ``await admin.migrate(url)`` creates or upgrades the schema,
``await admin.migration_status(url)`` reads where it stands, ``await admin.upgrade_sql(url)``
gives the SQL from the database's revision for review instead (``admin.migration_sql(url,
from_revision=...)`` the same offline). Transfers (``export_store``, ``import_store``,
``copy_store``) stream JSON Lines or rows; see the README for the export format.
``reindex`` and ``purge`` (``store.purge`` with progress) report ``progress(done, total)``
after every batch. ``backup(path, dest)`` copies an SQLite store while it is in use.
"""

from .._transfer.exporting import FormatError as FormatError
from .._transfer.exporting import TransferStats as TransferStats
from .._transfer.exporting import copy_store as copy_store
from .._transfer.exporting import export_store as export_store
from .._transfer.exporting import import_store as import_store
from ._backup import BackupResult as BackupResult
from ._backup import backup as backup
from ._database import DatabaseLocation as DatabaseLocation
from ._database import MigrationStatus as MigrationStatus
from ._database import locate as locate
from ._database import migrate as migrate
from ._database import migration_sql as migration_sql
from ._database import migration_status as migration_status
from ._database import upgrade_sql as upgrade_sql
from ._maintenance import purge as purge
from ._maintenance import purge_candidates as purge_candidates
from ._maintenance import reindex as reindex
from ._queries import ConversationInfo as ConversationInfo
from ._queries import StoreStats as StoreStats
from ._queries import count_conversations as count_conversations
from ._queries import describe as describe
from ._queries import list_conversations as list_conversations
from ._queries import stats as stats
from ._tail import ConversationTail as ConversationTail
from ._tail import tail as tail

__all__ = [
    "BackupResult",
    "ConversationInfo",
    "ConversationTail",
    "DatabaseLocation",
    "FormatError",
    "MigrationStatus",
    "StoreStats",
    "TransferStats",
    "backup",
    "copy_store",
    "count_conversations",
    "describe",
    "export_store",
    "import_store",
    "list_conversations",
    "locate",
    "migrate",
    "migration_sql",
    "migration_status",
    "purge",
    "purge_candidates",
    "reindex",
    "stats",
    "tail",
    "upgrade_sql",
]
