"""``map: {distributed: true}``: items as child tasks across the fleet, listed page by page.

The step lists its items from its source one page at a time, starts that page's child tasks
(one per item, or per ``items_per_task``) and writes how far it came in the checkpoint
(:class:`~toolkit.waits.MapItemsWait`) before it lists the next: the worker holds one
page, never the whole list, and a crash lists again from the last page written (the
children of a page listed twice are started once, keyed by their first item's index). Once
listed, the task waits (reason ``map``, no lease) and counts its children at intervals: it
fails, cancelling those still live, as soon as more items failed than it tolerates, and goes
on with a summary once none is live. Each child keeps its own result
(docs/composition.md#distributed-map).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from typing import Any

import anyio.to_thread

from toolkit.checkpoint import Frame
from toolkit.definition import DistributedMapStep, WorkflowDefinition
from toolkit.engine.attempts import AttemptKind, attempt, retry_delay
from toolkit.engine.cycle import Cycle
from toolkit.engine.failures import Error, error_data
from toolkit.engine.map_children import cancel_map_children
from toolkit.engine.protocol import Advance, Failed, Retry, StepContext, StepKind, Transition, Wait
from toolkit.errors import DefinitionRetired, InputError, PayloadRefused, UnknownDefinition
from toolkit.lifecycle import EventKind, WaitReason
from toolkit.payload import check_payload
from toolkit.store.map_items import NewItemTask
from toolkit.store.submission import concurrency_params
from toolkit.store.writes import Event
from toolkit.waits import MapItemsWait

#: Seconds between two counts of a map's children, first and at most. Each count is a claim
#: and a write of the parent (two events): the interval grows by :data:`CHECK_GROWTH` a
#: count, so a map learns its end within about a tenth of the time it has waited (at most
#: 30 s), and an hour's wait costs some 150 counts, not 3,600.
CHECK_EVERY = (1.0, 30.0)
#: How much longer each interval is than the one before.
CHECK_GROWTH = 1.1


@dataclasses.dataclass(frozen=True)
class Page:
    """One page of items, and the cursor of the next (None: this was the last)."""

    items: list[Any]
    cursor: Any


class ItemSourceInvalid(Exception):
    """A page source returned something that is not a page, or a file line is not JSON."""

    error_name = "ItemSourceInvalid"


async def run(ctx: StepContext, step: DistributedMapStep) -> Transition:
    """List the items (page by page, resuming), then count the children until none is live.

    A failure while listing (the source, or more failed items than the step tolerates)
    cancels the children started so far: nothing waits for them any more.
    """
    cycle = ctx.cycle
    occurrence = ctx.frame.occurrence(step.id)
    state = ctx.frame.wait
    if not isinstance(state, MapItemsWait) or state.occurrence != occurrence:
        state = MapItemsWait(occurrence)
    if state.listing:
        transition = await _list(ctx, step, state)
        if transition is not None:
            if isinstance(transition, Failed):
                reason = f"map step {step.id!r} failed"
                await cancel_map_children(cycle, reason, occurrence)
                ctx.frame.wait = None
            return transition
        assert isinstance(ctx.frame.wait, MapItemsWait)
        state = ctx.frame.wait
    return await _count(ctx, step, state)


async def _list(
    ctx: StepContext, step: DistributedMapStep, state: MapItemsWait
) -> Transition | None:
    """List the remaining pages, starting each page's children; None once all are listed.

    The children's definition version is pinned at the first page (a takeover keeps it). A
    transition ends the listing early: a retry of a page, or the step's failure.
    """
    store = ctx.cycle.services.store
    try:
        definition = await ctx.cycle.retrying(
            functools.partial(store.definitions.get, step.workflow, state.version)
            if state.version is not None
            else functools.partial(store.definitions.submittable, step.workflow, step.version)
        )
    except (UnknownDefinition, DefinitionRetired) as exc:
        return Failed(error_data(exc))
    if step.max_concurrency is not None and definition.concurrency is not None:
        return Failed({
            "name": "ConcurrencyConflict",
            "message": f"{definition.name} v{definition.version} has a concurrency key; "
            "a distributed map of it cannot bound its children with max_concurrency too",
        })  # fmt: skip
    state = dataclasses.replace(state, version=definition.version)
    while state.listing:
        page = await _next_page(ctx, step, state)
        if not isinstance(page, Page):
            return page
        state = await _start_page(ctx, step, state, definition, page)
        if state.listing and step.tolerated_failures is not None:
            failed = await _failed_early(ctx, step, state)
            if failed is not None:
                return failed
    return None


async def _failed_early(
    ctx: StepContext, step: DistributedMapStep, state: MapItemsWait
) -> Failed | None:
    """While listing: the step's failure once more items failed than ``tolerated_failures``.

    (A percentage is of all the items: it is checked once they are all listed.)
    """
    cycle = ctx.cycle
    progress = await cycle.retrying(
        functools.partial(cycle.services.store.map_items.progress, cycle.task.id,
                          state.occurrence, state.listed, tenant=cycle.task.tenant)
    )  # fmt: skip
    if progress.failed <= _tolerated(step, None):
        return None
    summary = await _summary(cycle, state)
    return Failed({
        "name": "MapFailed",
        "message": f"{summary['failed']} items failed while listing (after {state.listed}),"
        f" more than the {_tolerated(step, None)} tolerated",
        **summary,
    })  # fmt: skip


async def _count(ctx: StepContext, step: DistributedMapStep, state: MapItemsWait) -> Transition:
    """Count the children: fail past the tolerance, go on once none is live, else wait."""
    cycle = ctx.cycle
    store = cycle.services.store
    progress = await cycle.retrying(
        functools.partial(store.map_items.progress, cycle.task.id, state.occurrence,
                          state.listed, tenant=cycle.task.tenant)
    )  # fmt: skip
    tolerated = _tolerated(step, state.listed)
    if progress.failed > tolerated:
        summary = await _summary(cycle, state)  # before the cancels: what failed by itself
        reason = f"map step {step.id!r} failed"
        ids = await cancel_map_children(cycle, reason, state.occurrence)
        ctx.frame.wait = None
        return Failed({
            "name": "MapFailed",
            "message": f"{summary['failed']} of {state.listed} items failed, more than the "
            f"{tolerated} tolerated; {len(ids)} live tasks cancelled or asked to stop",
            **summary,
        })  # fmt: skip
    if progress.live == 0:
        ctx.frame.wait = None
        return Advance(await _summary(cycle, state), step.next)
    detail = {"step": step.id, "map": {"tasks": state.tasks, "live": progress.live}}
    interval = min(CHECK_EVERY[0] * CHECK_GROWTH**state.checks, CHECK_EVERY[1])
    state = dataclasses.replace(state, checks=state.checks + 1)
    return Wait(WaitReason.MAP, state, Event(EventKind.WAITING, detail), delay_seconds=interval)


def _tolerated(step: DistributedMapStep, items: int | None) -> int:
    """Failed items ``step`` tolerates out of ``items``: the smaller of its bounds, or 0.

    ``items`` None: not all are listed yet, so the percentage does not apply.
    """
    bounds = [] if step.tolerated_failures is None else [step.tolerated_failures]
    if step.tolerated_failure_percentage is not None and items is not None:
        bounds.append(math.floor(items * step.tolerated_failure_percentage / 100))
    return min(bounds, default=0)


async def _summary(cycle: Cycle, state: MapItemsWait) -> dict[str, Any]:
    """The step's output: counts over every child, and the first failed tasks."""
    summary = await cycle.retrying(
        functools.partial(cycle.services.store.map_items.summary, cycle.task.id,
                          state.occurrence, state.listed, tenant=cycle.task.tenant)
    )  # fmt: skip
    return {
        "items": state.listed, "tasks": summary.tasks, "succeeded": summary.succeeded,
        "failed": summary.failed, "errors": summary.errors,
    }  # fmt: skip


# --- listing ----------------------------------------------------------------------------------


async def _next_page(
    ctx: StepContext, step: DistributedMapStep, state: MapItemsWait
) -> Page | Transition:
    """The next page from the step's source, or what the step comes to instead."""
    source = step.items_from
    if source.page is None:
        assert source.file is not None
        try:
            return await anyio.to_thread.run_sync(
                _file_page, str(source.file.render(ctx.scope)), state, source.page_size
            )
        except (OSError, ItemSourceInvalid) as exc:
            return Failed(error_data(exc))
    page_step = source.page
    frame = Frame(
        cursor=step.id, prefix=f"{state.occurrence}/page/",
        visits={step.id: state.pages + 1}, attempts={},
    )  # fmt: skip
    frame.attempts[frame.occurrence(step.id)] = state.attempts
    rendered = page_step.args.render(ctx.scope)
    args = {**(rendered if isinstance(rendered, dict) else {}), "cursor": state.cursor}
    done = await attempt(dataclasses.replace(ctx, frame=frame), page_step, args)
    if done.kind is AttemptKind.COMPLETED:
        try:
            return _effect_page(page_step.handler, done.result, state.cursor)
        except ItemSourceInvalid as exc:
            return Failed(error_data(exc))
    assert done.kind is AttemptKind.FAILED and done.error is not None, done.kind
    delay = retry_delay(page_step, done)
    if delay is None:
        return Failed({**done.error, "attempts": done.attempt})
    ctx.frame.wait = dataclasses.replace(state, attempts=done.attempt)
    return Retry(done.occurrence, done.attempt, done.error, delay)


def _effect_page(handler: str, result: Any, given: Any) -> Page:
    """The page a page source's handler returned: ``{"items": [...], "cursor": next}``.

    A null or empty ``cursor`` ends the list; a page may be empty and still have a next one
    (a filtered scan), but not the cursor it was given (that would list it forever).

    Raises:
        ItemSourceInvalid: anything else (the message says what is wrong).
    """
    shape = '{"items": [...], "cursor": next or null}'
    if not isinstance(result, dict):
        raise ItemSourceInvalid(
            f"page source {handler!r} returned {type(result).__name__}; a page is an object "
            f"{shape}"
        )
    if not isinstance(result.get("items"), list):
        found = "no items" if "items" not in result else f"items {type(result['items']).__name__}"
        raise ItemSourceInvalid(
            f"page source {handler!r} returned a page with {found}; a page is {shape}"
        )
    cursor = result.get("cursor")
    if cursor == "":
        cursor = None
    if cursor is not None and cursor == given:
        raise ItemSourceInvalid(
            f"page source {handler!r} returned the cursor it was given ({given!r}): the same"
            " page again, forever; return the next page's cursor, or null at the end"
        )
    return Page(result["items"], cursor)


def _file_page(path: str, state: MapItemsWait, size: int) -> Page:
    """Up to ``size`` items of the JSON Lines file ``path`` from ``state.cursor``.

    The cursor is ``{"offset": bytes, "line": number}`` of the next line, None at the end of
    the file; blank lines are skipped.

    Raises:
        OSError: the file cannot be read.
        ItemSourceInvalid: a line is not JSON (the message names the file and line).
    """
    at = state.cursor if isinstance(state.cursor, dict) else {"offset": 0, "line": 1}
    offset, line = int(at["offset"]), int(at["line"])
    items: list[Any] = []
    with open(os.path.expanduser(path), "rb") as file:
        file.seek(offset)
        while len(items) < size:
            raw = file.readline()
            if not raw:
                return Page(items, None)
            offset += len(raw)
            line += 1
            if raw.strip():
                try:
                    items.append(json.loads(raw, parse_constant=_not_json))
                except ValueError as exc:
                    raise ItemSourceInvalid(f"{path}:{line - 1}: not a JSON value: {exc}") from None
    return Page(items, {"offset": offset, "line": line})


def _not_json(constant: str) -> Any:
    """``NaN``, ``Infinity``: Python's JSON reads them, JSON (and the store) does not."""
    raise ValueError(f"{constant} is not JSON")


async def _start_page(
    ctx: StepContext,
    step: DistributedMapStep,
    state: MapItemsWait,
    definition: WorkflowDefinition,
    page: Page,
) -> MapItemsWait:
    """Start a page's child tasks, then write how far the listing came."""
    cycle = ctx.cycle
    size = step.items_per_task or 1
    items = [
        _item_task(ctx, step, state.occurrence, definition, state.listed + i,
                   page.items[i] if step.items_per_task is None else page.items[i : i + size])
        for i in range(0, len(page.items), size)
    ]  # fmt: skip
    if items:
        await cycle.retrying(
            functools.partial(cycle.services.store.map_items.start, cycle.fence,
                              state.occurrence, definition, items)
        )  # fmt: skip
    state = dataclasses.replace(
        state, cursor=page.cursor, listed=state.listed + len(page.items),
        tasks=state.tasks + len(items), listing=page.cursor is not None, attempts=0,
        pages=state.pages + 1,
    )  # fmt: skip
    ctx.frame.wait = state
    await cycle.commit()
    return state


def _item_task(
    ctx: StepContext,
    step: DistributedMapStep,
    occurrence: str,
    definition: WorkflowDefinition,
    index: int,
    value: Any,
) -> NewItemTask:
    """The child task of the item (or batch) at ``index``: failed when its input is refused.

    Raises:
        ExpressionError: the step's ``input`` cannot be rendered (the task fails).
    """
    cycle = ctx.cycle
    if step.input is not None:
        name = "item" if step.items_per_task is None else "items"
        context = {**ctx.scope["context"], name: value, "index": index}
        value = step.input.render({**ctx.scope, "context": context})
    elif step.items_per_task is not None:
        value = {"items": value, "first_index": index}
    try:
        child_input = definition.validate_input(value)
        check_payload(child_input, cycle.services.store.leases.payload_limits)
        tags = definition.task_tags(child_input)
        key: tuple[str, int] | None
        if step.max_concurrency is not None:
            key = (f"map:{cycle.task.id}:{occurrence}", step.max_concurrency)
        else:
            own = concurrency_params(definition, child_input)
            key = None if own["concurrency_key"] is None else (
                own["concurrency_key"], own["concurrency_limit"]
            )  # fmt: skip
    except (InputError, PayloadRefused) as exc:
        error: Error = {**error_data(exc), "index": index}
        # a refused input is kept with its error, unless it is too large to keep
        return NewItemTask(index, None if isinstance(exc, PayloadRefused) else value, error=error)
    return NewItemTask(index, child_input, tags, concurrency=key)


KIND = StepKind(run)
