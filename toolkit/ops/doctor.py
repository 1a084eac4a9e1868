"""Health checks of a runifold database and its workers (DESIGN §5, "Health").

:func:`diagnose` returns findings; ``toolkit doctor`` prints them and exits 1 when one needs
action. Nothing here writes.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Literal

from toolkit.errors import DatabaseUnavailable
from toolkit.store.database import Database, redact_dsn
from toolkit.store.definitions import DefinitionCatalog
from toolkit.store.migrations import schema_status

Level = Literal["ok", "warning", "action"]

#: Clock offsets between this machine and the database above this many seconds are flagged.
CLOCK_OFFSET_WARNING = 1.0


@dataclasses.dataclass(frozen=True)
class Finding:
    """One health check's result.

    Attributes:
        check: the check's name.
        level: ``ok``, ``warning`` (look at it) or ``action`` (needs action now).
        message: what was found, for a person.
        value: the measured value, for machines.
    """

    check: str
    level: Level
    message: str
    value: Any = None


async def diagnose(dsn: str) -> list[Finding]:
    """Run every health check against the database at ``dsn``.

    Returns:
        The findings, in a fixed order; an unreachable database is a single ``action``
        finding (the password never appears).
    """
    try:
        db = await Database.connect(dsn, timeout=5)
    except DatabaseUnavailable as exc:
        return [Finding("database", "action", str(exc))]
    try:
        findings = [Finding("database", "ok", f"reachable at {redact_dsn(dsn)}")]
        status = await schema_status(db)
        if status.pending:
            findings.append(
                Finding(
                    "schema",
                    "action",
                    f"schema at version {status.current}, expected {status.expected}: "
                    "run `toolkit db migrate`",
                    status.current,
                )
            )
            return findings
        findings.append(
            Finding("schema", "ok", f"schema at version {status.current}", status.current)
        )
        findings.append(await _clock_offset(db))
        row = await db.fetch_one("health_counts")
        assert row is not None
        findings.extend(_count_findings(row))
        findings.append(_unavailable_finding(await DefinitionCatalog(db).unavailable()))
        findings.extend(_worker_findings(await db.fetch_all("health_workers")))
        findings.extend(_limit_findings(await db.fetch_all("limit_health")))
        findings.append(_key_finding(await db.fetch_all("key_health")))
        findings.append(_tenant_finding(await db.fetch_all("tenant_health")))
        return findings
    finally:
        await db.close()


async def _clock_offset(db: Database) -> Finding:
    """Offset of this machine's clock from the database's, with its round-trip bound."""
    async with db.connection() as conn:
        before = time.time()
        row = await (
            await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        ).fetchone()
        after = time.time()
    assert row is not None
    offset = float(row[0]) - (before + after) / 2
    bound = (after - before) / 2
    level: Level = "warning" if abs(offset) - bound > CLOCK_OFFSET_WARNING else "ok"
    return Finding(
        "clock_offset",
        level,
        f"database clock minus this machine's: {offset * 1000:+.1f} ms (±{bound * 1000:.1f} ms); "
        "leases use database time only, but logs and metrics compare the two",
        offset,
    )


def _count_findings(row: dict[str, Any]) -> list[Finding]:
    findings = []
    age = row["oldest_due_age"]
    findings.append(
        Finding(
            "oldest_queued",
            "warning" if age is not None and age > 60 else "ok",
            "no due task is waiting for a worker"
            if age is None
            else f"the oldest due task has waited {age:.1f} s for a worker",
            age,
        )
    )
    n = row["reconciliation"]
    findings.append(
        Finding(
            "reconciliation",
            "action" if n else "ok",
            f"{n} task(s) wait for reconciliation (`toolkit tasks --state waiting`, "
            "`toolkit reconcile`)"
            if n
            else "no task waits for reconciliation",
            n,
        )
    )
    n = row["expired_leases"]
    findings.append(
        Finding(
            "expired_leases",
            "action" if n else "ok",
            f"{n} expired lease(s) not yet reclaimed: is any worker running these definitions?"
            if n
            else "no expired lease is waiting to be reclaimed",
            n,
        )
    )
    return findings


def _unavailable_finding(unavailable: dict[tuple[str, int], int]) -> Finding:
    return Finding(
        "definition_unavailable",
        "action" if unavailable else "ok",
        "live tasks whose definition version no live worker has loaded: "
        + ", ".join(
            f"{name} v{version} ({n})" for (name, version), n in sorted(unavailable.items())
        )
        if unavailable
        else "every live task's definition version is served by a live worker",
        {f"{name} v{version}": n for (name, version), n in unavailable.items()},
    )


#: A task waiting this long for a downstream limit is flagged, seconds.
LIMIT_WAIT_WARNING = 300.0


def _limit_findings(rows: list[dict[str, Any]]) -> list[Finding]:
    """One line per downstream limit: its use and the tasks waiting for it (docs/limits.md)."""
    findings = []
    for row in rows:
        bounds = []
        if row["max_concurrency"] is not None:
            bounds.append(f"{row['in_use']}/{row['max_concurrency']} slots in use")
        if row["rate_per_second"] is not None:
            bounds.append(f"rate {row['rate_per_second']:g}/s")
        waiting, oldest = row["waiting"], row["oldest_wait"]
        text = f"limit {row['name']}: " + ", ".join(bounds or ["no bound"])
        text += f"; {waiting} task(s) waiting" if waiting else "; no task waiting"
        if waiting:
            text += f", the longest for {oldest:.1f} s"
        level: Level = "warning" if waiting and oldest > LIMIT_WAIT_WARNING else "ok"
        value = {"in_use": row["in_use"], "waiting": waiting, "oldest_wait": oldest}
        findings.append(Finding("limits", level, text, value))
    return findings


#: A task waiting this long for its concurrency key is flagged, seconds.
KEY_WAIT_WARNING = 3600.0


def _key_finding(rows: list[dict[str, Any]]) -> Finding:
    """The hottest concurrency keys: most tasks waiting for them (docs/flow-control.md)."""
    if not rows:
        return Finding("concurrency_keys", "ok", "no task waits for a concurrency key", [])
    keys = [
        f"{row['definition_name']} {row['concurrency_key']!r} (tenant {row['tenant']}): "
        f"{row['waiting']} waiting, the oldest for {row['oldest_wait']:.0f} s"
        for row in rows
    ]
    oldest = max(row["oldest_wait"] for row in rows)
    level: Level = "warning" if oldest > KEY_WAIT_WARNING else "ok"
    value = [
        {"tenant": row["tenant"], "definition": row["definition_name"],
         "key": row["concurrency_key"], "waiting": row["waiting"],
         "oldest_wait": row["oldest_wait"]}
        for row in rows
    ]  # fmt: skip
    return Finding("concurrency_keys", level, "hottest keys: " + "; ".join(keys), value)


def _tenant_finding(rows: list[dict[str, Any]]) -> Finding:
    """The hottest tenants: most due tasks not running (docs/tenants.md).

    Informational: ``oldest_queued`` judges the wait.
    """
    if not rows:
        return Finding("tenants", "ok", "no tenant has due tasks waiting for a worker", [])
    tenants = [
        f"{row['tenant']}: {row['due']} due (the oldest for {row['oldest_due']:.0f} s), "
        f"{row['active']} running" + (f" of {row['max_active']}" if row["max_active"] else "")
        + (f", weight {row['weight']}" if row["weight"] != 1 else "")
        for row in rows
    ]  # fmt: skip
    value = [
        {"tenant": row["tenant"], "due": row["due"], "oldest_due": row["oldest_due"],
         "active": row["active"], "max_active": row["max_active"], "weight": row["weight"]}
        for row in rows
    ]  # fmt: skip
    return Finding("tenants", "ok", "hottest tenants: " + "; ".join(tenants), value)


def _worker_findings(rows: list[dict[str, Any]]) -> list[Finding]:
    if not rows:
        return [Finding("workers", "warning", "no live worker is registered", 0)]
    findings = [Finding("workers", "ok", f"{len(rows)} live worker(s)", len(rows))]
    for row in rows:
        if row["heartbeat_seconds"] > row["lease_seconds"] / 3:
            findings.append(
                Finding(
                    "lease_settings",
                    "warning",
                    f"worker {row['worker_id']}: heartbeat {row['heartbeat_seconds']:g} s is above "
                    f"a third of its lease ({row['lease_seconds']:g} s)",
                )
            )
        if row["heartbeat_age"] > 2 * row["heartbeat_seconds"]:
            findings.append(
                Finding(
                    "heartbeat",
                    "warning",
                    f"worker {row['worker_id']}: last heartbeat {row['heartbeat_age']:.1f} s ago, "
                    f"its interval is {row['heartbeat_seconds']:g} s "
                    "(runtime stall or database latency?)",
                    row["heartbeat_age"],
                )
            )
    return findings
