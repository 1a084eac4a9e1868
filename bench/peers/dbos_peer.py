"""DBOS's no-op processing, for ``bench/peers/compare.py`` (run in the peers' virtualenv).

``seed DSN N STEPS CONCURRENCY``: launch DBOS on the database (its system tables), then
enqueue N workflows of STEPS no-op steps on queue ``bench`` with a ``DBOSClient`` (which
runs none of them). ``drain DSN N STEPS
CONCURRENCY``: launch DBOS with that queue (``worker_concurrency``, polled every 0.1 s
rather than its 1 s default) and exit once no workflow is enqueued or pending; it prints
the number that succeeded.
"""

from __future__ import annotations

import sys
import time

import psycopg
from dbos import DBOS, DBOSClient, DBOSConfig, EnqueueOptions

QUEUE = "bench"


def url(dsn: str) -> str:
    """``dsn`` as a URL (DBOS takes SQLAlchemy URLs), from libpq ``key=value`` pairs."""
    if "://" in dsn:
        return dsn
    pairs = dict(item.split("=", 1) for item in dsn.split())
    host, port = pairs.get("host", "localhost"), pairs.get("port", "5432")
    return f"postgresql://{pairs.get('user', 'postgres')}@{host}:{port}/{pairs['dbname']}"


@DBOS.step()
def noop_step() -> None:
    return None


@DBOS.workflow()
def noop_workflow(steps: int) -> None:
    for _ in range(steps):
        noop_step()


def counts(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT status, count(*) FROM dbos.workflow_status GROUP BY 1")
        return {str(status): int(count) for status, count in rows}


def main() -> None:
    command, dsn, jobs, steps, concurrency = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    config: DBOSConfig = {"name": "bench-peer", "system_database_url": url(dsn),
                          "log_level": "WARNING"}  # fmt: skip
    DBOS(config=config)
    DBOS.launch()  # creates or migrates the system tables
    if command == "seed":
        # Enqueued by a client, which runs nothing: only the drain's process executes them.
        DBOS.destroy()
        client = DBOSClient(system_database_url=url(dsn))
        options: EnqueueOptions = {"queue_name": QUEUE, "workflow_name": "noop_workflow"}
        for _ in range(jobs):
            client.enqueue(options, steps)
        client.destroy()
        return
    DBOS.register_queue(QUEUE, worker_concurrency=concurrency, polling_interval_sec=0.1)
    while True:
        now = counts(dsn)
        if now.get("ENQUEUED", 0) + now.get("PENDING", 0) == 0:
            break
        time.sleep(0.05)
    DBOS.destroy()
    print(f"processed {now.get('SUCCESS', 0)}")


if __name__ == "__main__":
    main()
