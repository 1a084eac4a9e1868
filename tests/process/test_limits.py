"""Downstream limits (docs/limits.md) over real ``toolkit run`` workers against one database.

Four workers (two for the SIGKILL) share the limits of ``tests/apps/limited.py``; what the
handlers themselves recorded is checked, never what the store claims about itself (the
store-level tests are ``tests/store/test_limits.py``)."""

from __future__ import annotations

import datetime
import signal
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.apps.limited import CREATE_TABLES
from tests.helpers.inprocess import invoke
from tests.helpers.processes import (
    query,
    submit_tasks,
    task_events,
    task_row,
    toolkit_process,
    wait_for,
)
from tests.helpers.workflows import API, FREE, LLM, SOLO


@pytest.fixture
def limited(dsn: str, tmp_path: Path) -> Iterator[Path]:
    """The limit tests' tables, and a folder with every one-step definition of the app."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(CREATE_TABLES)
    for name, text in {"llm": LLM, "api": API, "solo": SOLO, "free": FREE}.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    yield tmp_path


def start_workers(dsn: str, folder: Path, n: int, *extra: str) -> list[subprocess.Popen[str]]:
    """Start ``n`` workers and wait until every one is registered (claiming)."""
    workers = [
        toolkit_process(
            dsn,
            "run",
            "--app",
            "tests.apps.limited",
            "--definitions",
            str(folder),
            "--worker-id",
            f"lim-{i}",
            *extra,
        )
        for i in range(n)
    ]
    live = "SELECT count(*) FROM toolkit_workers WHERE stopped_at IS NULL"
    try:
        wait_for(lambda: query(dsn, live) == [(n,)], timeout=30, what=f"{n} workers")
    except AssertionError as exc:  # say why: which exited, with what, and who registered
        ended = []
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            _, err = worker.communicate(timeout=10)
            ended.append(f"exit {worker.returncode}: {err[-2000:]}")
        rows = query(dsn, "SELECT worker_id, stopped_at FROM toolkit_workers")
        raise AssertionError(f"{exc}; registered {rows}; workers: {ended}") from None
    return workers


def stop_workers(workers: list[subprocess.Popen[str]]) -> list[str]:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    outputs = []
    for worker in workers:
        out, err = worker.communicate(timeout=30)
        outputs.append(out + err)
    return outputs


def states(dsn: str, ids: list[int]) -> dict[str, int]:
    rows = query(
        dsn, "SELECT state, count(*) FROM toolkit_tasks WHERE id = ANY(%s) GROUP BY 1", (ids,)
    )
    return {str(state): int(n) for state, n in rows}  # type: ignore[call-overload]


def calls(dsn: str, limit: str) -> list[tuple[datetime.datetime, datetime.datetime | None]]:
    return query(
        dsn,
        "SELECT started_at, ended_at FROM test_limit_calls WHERE limit_name = %s "
        "ORDER BY started_at",
        (limit,),
    )  # type: ignore[return-value]


def test_max_concurrency_holds_over_four_workers_and_unlimited_tasks_are_not_slowed(
    dsn: str, limited: Path
) -> None:
    """24 calls of 0.3 s under ``llm`` (max_concurrency 3) and 24 unlimited ones submitted
    right behind them, four workers of concurrency 4: never more than 3 calls inside the
    limit at once, and the unlimited tasks run at once while the limited backlog drains."""
    workers = start_workers(
        dsn, limited, 4, "--concurrency", "4", "--lease", "5", "--heartbeat", "1"
    )
    try:
        limited_ids = submit_tasks(dsn, LLM, [{"seconds": 0.3}] * 24)
        free_ids = submit_tasks(dsn, FREE, [{"seconds": 0.0}] * 24)
        wait_for(
            lambda: states(dsn, free_ids) == {"succeeded": 24},
            timeout=30,
            what="the unlimited tasks",
        )
        free_done = time.monotonic()
        wait_for(
            lambda: states(dsn, limited_ids) == {"succeeded": 24},
            timeout=45,
            what="the limited tasks",
        )
        limited_done = time.monotonic()
    finally:
        outputs = stop_workers(workers)
    assert all("Traceback" not in out for out in outputs), outputs
    peak = query(dsn, "SELECT peak, inside FROM test_limit_inside WHERE limit_name = 'llm'")
    assert peak == [(3, 0)]  # the limit was reached, never exceeded
    intervals = calls(dsn, "llm")
    assert len(intervals) == 24
    at_once = max(
        sum(1 for s, e in intervals if s <= start and e is not None and e > start)
        for start, _ in intervals
    )
    assert at_once <= 3  # the same from the recorded database times
    # Deferred tasks waited without their lease, with reason limit.
    kinds = [e["kind"] for i in limited_ids for e in task_events(dsn, i)]
    assert kinds.count("limit_deferred") > 0
    # The unlimited tasks were not held behind the limited backlog: half of them were
    # claimed within a quarter of the time the backlog took to drain (at least 2.4 s: 24
    # calls of 0.3 s, 3 at once), a ratio that holds however loaded the machine is.
    delays = [
        (e["at"] - task_row(dsn, i)["created_at"]).total_seconds()
        for i in free_ids
        for e in task_events(dsn, i)
        if e["kind"] == "claimed"
    ][:24]
    submitted = min(task_row(dsn, i)["created_at"] for i in limited_ids)
    drained = max(e for _, e in intervals) - submitted
    assert statistics.median(delays) < drained.total_seconds() / 4, (delays, drained)
    assert limited_done - free_done > 0.5  # they finished while the limited ones went on
    assert query(
        dsn,
        "SELECT count(*) FROM toolkit_limit_slots s JOIN toolkit_tasks t "
        "ON t.id = s.task_id AND t.tenant = s.tenant AND t.state = 'leased'",
    ) == [(0,)]


TAKES = """
CREATE TABLE test_token_takes (at timestamptz NOT NULL, tokens float8 NOT NULL);
-- A row per token taken: a batch of acquisitions takes several in one update, the bucket
-- refilled to its new time less the tokens it holds after.
CREATE FUNCTION test_token_taken() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    refilled float8;
BEGIN
    SELECT least(l.burst, OLD.tokens + l.rate_per_second
                 * extract(epoch FROM NEW.refreshed_at - OLD.refreshed_at))
    INTO refilled FROM toolkit_limits l WHERE l.name = NEW.name;
    INSERT INTO test_token_takes
    SELECT clock_timestamp(), NEW.tokens FROM generate_series(1, round(refilled - NEW.tokens)::int);
    RETURN NEW;
END $$;
CREATE TRIGGER test_token_taken AFTER UPDATE ON toolkit_limit_buckets
    FOR EACH ROW EXECUTE FUNCTION test_token_taken();
"""


def over_bucket(times: list[datetime.datetime], rate: float, burst: float) -> float:
    """The most calls of any window [t_i, t_j] beyond ``burst + rate * (t_j - t_i)``."""
    worst = -burst
    for i, begin in enumerate(times):
        for j in range(i, len(times)):
            window = (times[j] - begin).total_seconds()
            worst = max(worst, (j - i + 1) - (burst + rate * window))
    return worst


@pytest.mark.one_postgresql  # its instrument: a trigger on the buckets (a reference table)
def test_a_rate_holds_over_ten_seconds_within_one_token(dsn: str, limited: Path) -> None:
    """220 calls under ``api`` (20/s, burst 20) with four workers: in every window of the
    run, calls <= burst + rate * window + 1, and the run takes the time the bucket says."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TAKES)  # every token taken, at its database time
    workers = start_workers(
        dsn, limited, 4, "--concurrency", "8", "--lease", "5", "--heartbeat", "1"
    )
    try:
        ids = submit_tasks(dsn, API, [{}] * 220)
        wait_for(lambda: states(dsn, ids) == {"succeeded": 220}, timeout=40, what="the tasks")
    finally:
        outputs = stop_workers(workers)
    assert all("Traceback" not in out for out in outputs), outputs
    starts = [s for s, _ in calls(dsn, "api")]
    assert len(starts) == 220
    rate, burst = 20.0, 20.0
    takes = [t for (t,) in query(dsn, "SELECT at FROM test_token_takes ORDER BY at")]
    assert len(takes) == 220  # one token per call, none taken twice
    # Over the whole run this says takes[-1] - takes[0] >= (220 - burst - 1) / rate: the
    # rate really held the run back for about 10 s.
    assert over_bucket(takes, rate, burst) <= 1.0
    # The calls as the handler saw them start: the same, give or take the latency between
    # a token's take and the call (one token per 50 ms of it at 20/s). The first and last
    # starts may differ in that latency, so the run's length is bounded through the takes.
    assert over_bucket(starts, rate, burst) <= 3.0
    run = (starts[-1] - starts[0]).total_seconds()
    assert run < (220 - burst) / rate + 5  # and the tasks were not left waiting much longer


def test_a_sigkilled_workers_slot_frees_at_its_lease_expiry(dsn: str, limited: Path) -> None:
    """A worker holding the only ``solo`` slot is SIGKILLed mid-call: the waiting task shows
    reason limit, and another worker takes the slot once the dead lease expires (2 s)."""
    workers = start_workers(
        dsn, limited, 2, "--concurrency", "2", "--lease", "2", "--heartbeat", "0.5"
    )
    try:
        (hung,) = submit_tasks(dsn, SOLO, [{"hang_first": 60}])
        wait_for(lambda: len(calls(dsn, "solo")) == 1, timeout=20, what="the first call")
        (second,) = submit_tasks(dsn, SOLO, [{"seconds": 0}])
        wait_for(
            lambda: task_row(dsn, second)["wait_reason"] == "limit",
            timeout=10,
            what="the second task to wait for the limit",
        )
        for _ in range(5):  # the task looks again now and then: catch it waiting
            out = invoke(dsn, "show", str(second))[1]
            if "state:      waiting (limit)" in out:
                break
        assert "state:      waiting (limit)" in out
        assert "waits for:  limit 'solo' (deferral " in out
        owner = task_row(dsn, hung)["lease_owner"]
        victim = workers[int(str(owner).rsplit("-", 1)[1])]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        expiry = task_row(dsn, hung)["lease_expires_at"]
        wait_for(lambda: len(calls(dsn, "solo")) == 3, timeout=20, what="the slot to free")
        wait_for(
            lambda: states(dsn, [hung, second]) == {"succeeded": 2}, timeout=20, what="both tasks"
        )
    finally:
        stop_workers(workers)
    later = [s for s, _ in calls(dsn, "solo")][1:]
    assert min(later) >= expiry  # the dead worker's slot held until its lease expired
    assert (min(later) - expiry).total_seconds() < 3.0  # and was taken soon after
    assert query(
        dsn,
        "SELECT count(*) FROM toolkit_limit_slots s JOIN toolkit_tasks t "
        "ON t.id = s.task_id AND t.tenant = s.tenant AND t.state = 'leased'",
    ) == [(0,)]
