"""OpenTelemetry traces of tasks with real workers (issue 23, docs/tracing.md).

The workers run ``tests.apps.traced``, which configures the OpenTelemetry SDK to write each
span to a JSON-lines file per process as it ends (``tests/helpers/spans.py``), so a worker
that is SIGKILLed keeps the spans it had finished.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import anyio
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from tests.helpers.processes import query, task_row, toolkit_env, toolkit_process, wait_for
from tests.helpers.spans import SPAN_DIR, Spans, waterfall_svg
from tests.helpers.workflows import definition
from toolkit.store import Store

THREE_STEPS = """
name: traced-three
version: 1
input: {type: object}
start: first
steps:
  first: {effect: traced.step, idempotent: true, next: second}
  second: {effect: traced.step, idempotent: true, next: third}
  third: {effect: traced.step, idempotent: true}
"""

FAN_OUT = """
name: traced-fanout
version: 1
input: {type: object, properties: {items: {default: [1, 2, 3, 4, 5]}}}
start: each
steps:
  each:
    map:
      items: "${ input.items }"
      branch:
        start: item
        steps:
          item: {effect: traced.step, idempotent: true, args: {value: "${ context.item }"}}
    next: child
  child:
    workflow: {name: traced-child, input: {}}
"""

CHILD = """
name: traced-child
version: 1
input: {type: object}
start: only
steps:
  only: {effect: traced.step, idempotent: true}
"""

HANGS_ONCE = """
name: traced-crash
version: 1
input: {type: object}
start: first
steps:
  first: {effect: traced.step, idempotent: true, next: second}
  second: {effect: traced.hang_first, idempotent: true, next: third}
  third: {effect: traced.step, idempotent: true}
"""


def submitter(trace_id: int, span_id: int) -> NonRecordingSpan:
    """The span of a caller that submits a task (a web request, say)."""
    sampled = TraceFlags(TraceFlags.SAMPLED)
    return NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=False, trace_flags=sampled))


def submit_under(
    dsn: str, folder: Path, texts: list[str], submits: list[tuple[str, NonRecordingSpan]]
) -> list[int]:
    """Deploy ``texts`` (written to ``folder`` for the worker too) and submit one task of
    each named definition, each inside its submitter's span."""

    async def main() -> list[int]:
        ids = []
        async with await Store.open(dsn, migrate_schema=False) as store:
            for n, text in enumerate(texts):
                (folder / f"definition-{n}.yaml").write_text(text)
                await store.definitions.deploy(definition(text))
            for name, span in submits:
                d = await store.definitions.submittable(name)
                with trace.use_span(span):
                    ids.extend(await store.tasks.submit(d, [{}]))
        return ids

    return anyio.run(main)


def worker(dsn: str, definitions: Path, spans: Path, *args: str) -> subprocess.Popen[str]:
    """A worker of ``tests.apps.traced`` writing its spans under ``spans``."""
    return toolkit_process(
        dsn, "run", "--app", "tests.apps.traced", "--definitions", str(definitions),
        "--lease", "2", "--heartbeat", "0.5", *args, env={SPAN_DIR: str(spans)},
    )  # fmt: skip


def hex_ids(span: NonRecordingSpan) -> tuple[str, str]:
    context = span.get_span_context()
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def only(found: list[dict[str, Any]], spans: Spans, what: str) -> dict[str, Any]:
    assert len(found) == 1, f"{len(found)} spans {what}:\n{spans.tree()}"
    return found[0]


def test_a_task_is_one_trace_from_its_submitter_through_steps_items_and_children(
    dsn: str, tmp_path: Path
) -> None:
    definitions, folder = tmp_path / "definitions", tmp_path / "spans"
    definitions.mkdir()
    folder.mkdir()
    web, batch = submitter(0xA1 << 64, 0xB1), submitter(0xA2 << 64, 0xB2)
    three, fan = submit_under(
        dsn, definitions, [THREE_STEPS, FAN_OUT, CHILD],
        [("traced-three", web), ("traced-fanout", batch)],
    )  # fmt: skip
    run = worker(dsn, definitions, folder, "--until-idle")
    _, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    spans = Spans.read(folder)

    # One trace from the submitting span through every step of a three-step workflow.
    web_trace, web_span = hex_ids(web)
    cycle = only(spans.named("run traced-three", **{"task.id": three}), spans, "of the cycle")
    where = (cycle["trace_id"], cycle["parent_id"], cycle["kind"])
    assert where == (web_trace, web_span, "CONSUMER"), spans.tree()
    attributes = cycle["attributes"]
    assert attributes["runifold.task.tenant"] == "default", attributes
    assert attributes["runifold.workflow.name"] == "traced-three", attributes
    assert attributes["runifold.workflow.version"] == 1, attributes
    assert attributes["runifold.fencing_token"] == 1, attributes
    assert attributes["runifold.worker.id"], attributes
    assert attributes["runifold.outcome"] == "succeeded", attributes
    steps = spans.children(cycle)
    assert [s["name"] for s in steps] == ["step first", "step second", "step third"], spans.tree()
    for step in steps:
        assert step["trace_id"] == web_trace
        assert step["attributes"]["runifold.step.attempt"] == 1, step
        assert step["attributes"]["runifold.effect.idempotent"] is True, step
        assert step["attributes"]["runifold.outcome"] == "completed", step
        # The handler runs inside its step's span: the application's own span nests there.
        assert [s["name"] for s in spans.children(step)] == ["own work"], spans.tree()
    assert all(not any("input" in k or "result" in k for k in s["attributes"]) for s in spans.spans)

    # A map of 5 items: 5 item spans under the map's span; the child in the parent's trace.
    batch_trace, _ = hex_ids(batch)
    fan_cycles = spans.named("run traced-fanout", **{"task.id": fan})
    assert {s["trace_id"] for s in fan_cycles} == {batch_trace}, spans.tree()
    mapped = only(spans.named("step each", **{"task.id": fan}), spans, "of the map")
    items = spans.children(mapped)
    assert sorted(s["name"] for s in items) == [f"item {n}" for n in range(5)], spans.tree()
    assert all(s["attributes"]["runifold.outcome"] == "succeeded" for s in items), spans.tree()
    starts = spans.named("step child", **{"task.id": fan})
    assert task_row(dsn, fan)["state"] == "succeeded", (task_row(dsn, fan)["error"], spans.tree())
    child_id = int(query(dsn, "SELECT id FROM toolkit_tasks WHERE parent_id = %s", (fan,))[0][0])  # type: ignore[call-overload]
    child = only(spans.named("run traced-child", **{"task.id": child_id}), spans, "of the child")
    assert child["trace_id"] == batch_trace, spans.tree()
    assert child["parent_id"] in {s["span_id"] for s in starts}, spans.tree()
    # The parent's cycle after the child ended follows from the one that started it.
    later = [s for s in fan_cycles if s["links"]]
    assert later and later[-1]["links"][0]["attributes"] == {"runifold.link.reason": "resumed"}
    picture = waterfall_svg(spans, batch_trace, f"trace {batch_trace}: traced-fanout, its child")
    ElementTree.fromstring(picture)  # well-formed; docs/images/trace.svg is one such picture
    if os.environ.get("RUNIFOLD_DOCS_PICTURES"):  # to redraw the docs' picture
        (Path(os.environ["RUNIFOLD_DOCS_PICTURES"]) / "trace.svg").write_text(picture)


def test_the_attempt_after_a_crash_links_to_the_attempt_that_was_lost(
    dsn: str, tmp_path: Path
) -> None:
    definitions, folder = tmp_path / "definitions", tmp_path / "spans"
    definitions.mkdir()
    folder.mkdir()
    (task_id,) = submit_under(
        dsn, definitions, [HANGS_ONCE], [("traced-crash", submitter(0xC1 << 64, 0xD1))]
    )
    first = worker(dsn, definitions, folder, "--worker-id", "first")
    try:
        wait_for(
            lambda: bool(query(dsn, "SELECT 1 FROM test_calls WHERE step = 'second'")),
            what="the second step's handler hanging",
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
    second = worker(dsn, definitions, folder, "--worker-id", "second")
    try:
        wait_for(lambda: task_row(dsn, task_id)["state"] == "succeeded", timeout=60,
                 what=f"task {task_id} succeeded")  # fmt: skip
    finally:
        second.send_signal(signal.SIGTERM)
        _, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    lost = Spans.read(folder, first.pid)
    # The lost attempt's cycle span never ended; the step it had finished did.
    finished = only(lost.named("step first"), lost, "finished before the crash")
    assert lost.named("run traced-crash") == [], lost.tree()
    taken_over = Spans.read(folder, second.pid)
    cycle = only(taken_over.named("run traced-crash"), taken_over, "after the takeover")
    assert cycle["attributes"]["runifold.task.recovered"] is True, cycle
    assert cycle["attributes"]["runifold.fencing_token"] == 2, cycle
    assert cycle["links"] == [{
        "trace_id": finished["trace_id"], "span_id": finished["parent_id"],
        "attributes": {"runifold.link.reason": "takeover"},
    }], taken_over.tree()  # fmt: skip
    retried = only(taken_over.named("step second"), taken_over, "of the second step")
    assert retried["attributes"]["runifold.step.attempt"] == 2, retried


NO_OPENTELEMETRY = """
import atexit, sys

class Unimportable:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, Unimportable())
atexit.register(lambda: print("opentelemetry modules:",
                              sorted(m for m in sys.modules if m.startswith("opentelemetry"))))
from toolkit.cli import main
sys.argv = ["toolkit", *sys.argv[1:]]
main()
"""


def test_without_the_extra_the_worker_runs_and_imports_no_opentelemetry(
    dsn: str, tmp_path: Path
) -> None:
    definitions = tmp_path / "definitions"
    definitions.mkdir()
    script = tmp_path / "no_otel.py"
    script.write_text(textwrap.dedent(NO_OPENTELEMETRY))
    (task_id,) = submit_under(
        dsn, definitions, [THREE_STEPS.replace("traced.step", "count.work")],
        [("traced-three", submitter(0xE1 << 64, 0xF1))],
    )  # fmt: skip
    run = subprocess.run(
        [sys.executable, str(script), "run", "--app", "tests.apps.counting",
         "--definitions", str(definitions), "--until-idle"],
        env=toolkit_env(dsn), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "opentelemetry modules: []" in run.stdout, run.stdout
    assert task_row(dsn, task_id)["state"] == "succeeded"

