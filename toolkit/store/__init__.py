"""The store: PostgreSQL, the only code that writes task state (DESIGN §2).

:class:`Store` is a small façade over one :class:`~toolkit.store.database.Database`, split by
aggregate: the definition catalog, tasks, leases and fenced writes, worker membership,
tenant admission, bulk plans.
"""

from __future__ import annotations

from types import TracebackType

from toolkit.errors import SchemaOutdated
from toolkit.store.branches import BranchRows
from toolkit.store.budgets import Budgets
from toolkit.store.bulk import Bulk
from toolkit.store.callbacks import Callbacks
from toolkit.store.children import Children
from toolkit.store.database import Database
from toolkit.store.definitions import DefinitionCatalog
from toolkit.store.events import Events
from toolkit.store.leases import Leases
from toolkit.store.limits import Limits
from toolkit.store.map_items import MapItems
from toolkit.store.migrations import migrate, schema_status
from toolkit.store.schedules import Schedules
from toolkit.store.streams import Streams
from toolkit.store.tasks import Tasks
from toolkit.store.tenants import Tenants
from toolkit.store.workers import Membership


class Store:
    """An open connection pool to a migrated runifold database.

    Use ``async with await Store.open(dsn) as store:`` or call :meth:`close`.

    Attributes:
        db: the database seam (pool and named queries).
        definitions: registered definition versions.
        tasks: submission and reads.
        leases: claim, heartbeat, fenced writes.
        workers: worker registration.
        tenants: tenant admission settings and budget amounts.
        limits: downstream limits (fleet-wide concurrency and rate limits of effects).
        callbacks: callback tokens of effects completed from outside.
        budgets: tenant budget reservations of parallel and map steps.
        children: child tasks started by ``workflow`` steps.
        map_items: the child tasks of distributed map steps, and their per-item results.
        bulk: bulk actions by filter: plans, and applying them.
        schedules: recurring schedules, and the firing of their ticks.
        branches: the branch rows of parallel and map steps in progress.
        events: events: emit, the tasks they start, the waits they reach (docs/events.md).
        streams: what handlers publish while a step runs, and progress (docs/progress.md).
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self.definitions = DefinitionCatalog(db)
        self.tasks = Tasks(db)
        self.leases = Leases(db)
        self.workers = Membership(db)
        self.tenants = Tenants(db)
        self.limits = Limits(db)
        self.callbacks = Callbacks(db)
        self.budgets = Budgets(db)
        self.children = Children(db)
        self.map_items = MapItems(db)
        self.bulk = Bulk(db)
        self.schedules = Schedules(db)
        self.branches = BranchRows(db)
        self.events = Events(db)
        self.streams = Streams(db)

    @classmethod
    async def open(cls, dsn: str, *, pool_size: int = 8, migrate_schema: bool = True) -> Store:
        """Connect, and bring the schema up to date (or check it is).

        Args:
            dsn: libpq connection string or URI.
            pool_size: connections at most.
            migrate_schema: apply pending migrations (True) or refuse an outdated schema.

        Raises:
            DatabaseUnavailable: the database cannot be reached.
            SchemaOutdated: ``migrate_schema`` is False and migrations are pending.
        """
        db = await Database.connect(dsn, max_size=pool_size)
        try:
            if migrate_schema:
                await migrate(db)
            else:
                status = await schema_status(db)
                if status.pending:
                    raise SchemaOutdated(
                        f"the database schema is at version {status.current}, this toolkit "
                        f"needs {status.expected}: run `toolkit db migrate`"
                    )
        except BaseException:
            await db.close()
            raise
        return cls(db)

    async def close(self) -> None:
        """Close the pool."""
        await self.db.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
