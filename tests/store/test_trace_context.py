"""The submitter's trace context is stored with the task (issue 23, docs/tracing.md): from a
span of the Python caller, and from ``TRACEPARENT`` for a CLI command."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from tests.helpers.inprocess import sql
from tests.helpers.processes import toolkit_process
from tests.helpers.workflows import definition
from toolkit.store import Store

pytestmark = pytest.mark.anyio

ONE_STEP = """
name: traced
version: 1
input: {type: object}
start: work
steps:
  work: {effect: count.work, idempotent: true}
"""
TRACE, SPAN = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE:032x}-{SPAN:016x}-01"


def caller_span() -> NonRecordingSpan:
    sampled = TraceFlags(TraceFlags.SAMPLED)
    return NonRecordingSpan(SpanContext(TRACE, SPAN, is_remote=False, trace_flags=sampled))


async def trace_parents(store: Store, ids: list[int]) -> list[str | None]:
    rows = await sql(
        store, "SELECT trace_parent FROM toolkit_tasks WHERE id = ANY(%s) ORDER BY id", ids
    )
    return [row[0] for row in rows]


async def test_a_submit_inside_a_span_stores_its_traceparent_and_outside_one_nothing(
    store: Store,
) -> None:
    d = definition(ONE_STEP)
    await store.definitions.deploy(d)
    with trace.use_span(caller_span()):
        traced = await store.tasks.submit(d, [{}, {}])
        keyed, _ = await store.tasks.submit_keyed(d, {}, key="k1")
    untraced = await store.tasks.submit(d, [{}])
    assert await trace_parents(store, [*traced, keyed]) == [TRACEPARENT] * 3
    assert await trace_parents(store, untraced) == [None]


async def test_a_cli_submit_joins_the_trace_of_the_traceparent_variable(
    store: Store, dsn: str
) -> None:
    await store.definitions.deploy(definition(ONE_STEP))
    submit = toolkit_process(
        dsn, "submit", "traced", "--input", "{}", env={"TRACEPARENT": TRACEPARENT}
    )
    out, err = submit.communicate(timeout=60)
    assert submit.returncode == 0, err
    assert await trace_parents(store, [int(out.strip())]) == [TRACEPARENT]
