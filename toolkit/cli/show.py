"""``show``: one task in detail: state, checkpoint, effect evidence, signals and events."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import click

from toolkit.cli.options import task_tenant_option
from toolkit.cli.output import clip, echo_json
from toolkit.cli.session import Settings, run_in_store
from toolkit.lifecycle import cursor_text, received_signal, received_text
from toolkit.store import Store
from toolkit.store.concurrency_keys import live_tasks

#: How an emitted event touched the task, as ``show`` labels it (else it was delivered).
_EMITTED_LABELS = {"started": "started by:", "cancelled": "cancelled:"}


@click.command()
@click.argument("task_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@task_tenant_option
@click.pass_obj
def show(settings: Settings, task_id: int, as_json: bool, tenant: str | None) -> None:
    """Show a task: state, checkpoint, effect evidence and events.

    Long values are cut to a line, ending in an ellipsis; --json prints them whole.
    """

    async def task_in_detail(store: Store) -> dict[str, Any]:
        record = await store.tasks.get(task_id, tenant=tenant)
        known = record.tenant
        return {
            "task": dataclasses.asdict(record),
            "evidence": await store.tasks.evidence(task_id, tenant=known),
            "signals": await store.tasks.signals(task_id, tenant=known),
            "events": await store.tasks.events(task_id, tenant=known),
            "emitted": await store.events.of_task(task_id, tenant=known),
            "branches": [
                dataclasses.asdict(branch)
                for branch in await store.branches.of_task(task_id, tenant=known)
            ],
            "queue": await store.tasks.queue_position(task_id, tenant=known)
            if record.state in ("queued", "waiting")
            else None,
            "key_tasks": await live_tasks(
                store.db, record.tenant, record.definition_name, record.concurrency_key, 5
            )
            if record.concurrency_key is not None
            else [],
            "map": await _map_progress(store, record),
        }

    data = run_in_store(settings, task_in_detail)
    if as_json:
        echo_json(data)
        return
    task = data["task"]
    click.echo(
        f"task {task['id']}: {task['definition_name']} v{task['definition_version']} "
        f"({task['definition_digest'][:12]}), tenant {task['tenant']}"
    )
    click.echo(
        f"  state:      {task['state']}"
        + (f" ({task['wait_reason']})" if task["wait_reason"] else "")
    )
    if task["lease_owner"]:
        click.echo(
            f"  lease:      {task['lease_owner']} token {task['lease_token']} "
            f"until {task['lease_expires_at']}"
        )
    click.echo(f"  claims:     {task['attempts']}, fencing token {task['lease_token']}")
    click.echo(f"  input:      {json.dumps(task['input'], default=str)}")
    if task["schedule_name"]:
        click.echo(f"  schedule:   {task['schedule_name']}, tick {task['scheduled_at']}")
    if task["state"] == "waiting" and task["wait_reason"] == "start":
        click.echo(f"  starts at:  {task['run_at']} (a delayed start)")
    if task["state"] == "waiting" and task["wait_reason"] == "debounce":
        click.echo(f"  starts at:  {task['run_at']} (debounced: unless its key is submitted again)")
    if data["queue"] is not None and data["queue"]["due"]:
        click.echo(f"  due:        {_queue_text(data['queue'])}")
    if task["deadline_at"] is not None and task["state"] in ("queued", "leased", "waiting"):
        click.echo(f"  deadline:   {task['deadline_at']} (fails with Timeout if not ended by then)")
    if task["priority"]:
        p = task["priority"]
        click.echo(f"  priority:   {p} (claimed as if due {p} min sooner)")
    if task["concurrency_key"] is not None:
        click.echo(f"  key:        {_key_text(task, data['key_tasks'])}")
    if task["tags"]:
        click.echo(f"  tags:       {' '.join(f'{k}={v}' for k, v in sorted(task['tags'].items()))}")
    if task["state"] == "waiting" and task["wait_reason"] == "reconciliation":
        click.echo(
            f"  uncertain:  step occurrence {task['checkpoint'].get('pending')} "
            "(intent recorded, outcome unknown)"
        )
    click.echo(f"  cursor:     {cursor_text(task['checkpoint'].get('cursor'), task['state'])}")
    wait = task["checkpoint"].get("wait")
    if task["state"] == "waiting" and wait:
        received = received_signal(wait, data["signals"])
        if received is not None:  # sent, not consumed yet: nothing lost, no worker yet
            click.echo(f"  waits for:  {received_text(received, wait['occurrence'])}")
        else:
            due = f"at {wait['occurrence']}, due {task['run_at']}"
            click.echo(f"  waits for:  {_wait_text(wait)} {due}")
    if data["map"] is not None:
        click.echo(f"  map:        {data['map']}")
    for line in _budget_lines(task["checkpoint"]):
        click.echo(line)
    for occurrence, callback in (task["checkpoint"].get("callbacks") or {}).items():
        click.echo(
            f"  callback:   {occurrence} attempt {callback['attempt']}: token {callback['token']}"
        )
    for line in _fanout_lines(task["checkpoint"].get("fanout"), data["branches"]):
        click.echo(line)
    if task["cancel_requested"] and task["state"] == "leased":
        click.echo(f"  cancel:     requested ({task['cancel_requested'].get('reason')})")
    if task["result"] is not None:
        click.echo(f"  result:     {json.dumps(task['result'], default=str)}")
    if task["error"] is not None:
        click.echo(f"  error:      {json.dumps(task['error'], default=str)}")
    # Every task shows its evidence, none yet included (the notebook's detail says "(none)").
    click.echo("  evidence:" if data["evidence"] else "  evidence:   (none)")
    for ev in _evidence_shown(data["evidence"]):
        if isinstance(ev, str):
            click.echo(f"    {ev}")
            continue
        outcome = ev["result"] if ev["record"] == "completed" else ev["error"]
        click.echo(
            f"    {ev['recorded_at']:%H:%M:%S.%f} {ev['occurrence']:<20} {ev['record']:<9} "
            f"attempt {ev['attempt']} token {ev['fencing_token']} "
            f"{'' if outcome is None else clip(outcome, 160)}"
        )
    for emitted in data["emitted"]:
        how = _EMITTED_LABELS.get(emitted["how"], "delivered:")
        click.echo(
            f"  {how:<11} event {emitted['id']} ({emitted['name']}, "
            f"{emitted['emitted_at']:%Y-%m-%d %H:%M:%S})"
        )
    if data["signals"]:
        click.echo("  signals:")
    for sig in data["signals"]:
        status = (
            f"consumed by {sig['consumed_by']} (token {sig['consumed_token']})"
            if sig["consumed_at"]
            else "pending"
        )
        name = sig["name"] + (f" for {sig['address']}" if sig.get("address") else "")
        click.echo(
            f"    {sig['sent_at']:%H:%M:%S.%f} {name:<20} {status} {clip(sig['payload'], 120)}"
        )
    click.echo("  events:")
    for ev in data["events"]:
        detail = "" if ev["detail"] is None else clip(ev["detail"], 160)
        click.echo(
            f"    {ev['at']:%H:%M:%S.%f} {ev['kind']:<24} {ev['worker_id'] or '':<24} "
            f"{'' if ev['fencing_token'] is None else 'token ' + str(ev['fencing_token'])} {detail}"
        )


def _queue_text(queue: dict[str, Any]) -> str:
    """Why a due task is not running yet: what holds it, else its place in its tenant."""
    if not queue["served"]:
        return "no live worker has loaded its definition version (`toolkit doctor`)"
    if queue["paused"]:
        return "its tenant is paused (`toolkit tenants set TENANT --resumed`)"
    if queue["max_active"] is not None and queue["active"] >= queue["max_active"]:
        return (
            f"its tenant is at max_active ({queue['active']}/{queue['max_active']} leased); "
            f"{queue['ahead']} due task(s) of the tenant before it"
        )
    ahead = queue["ahead"]
    more = "+" if ahead >= 10_000 else ""
    return f"waits for a worker; {ahead}{more} due task(s) of its tenant before it in claim order"


def _key_text(task: dict[str, Any], key_tasks: list[int]) -> str:
    """The concurrency key line: held, or waited for (and by whom it is held)."""
    key = json.dumps(task["concurrency_key"])
    if task["key_held"]:
        return f"{key} (holds it until it ends)"
    if task["wait_reason"] != "concurrency":
        return key
    holders = [str(other) for other in key_tasks if other != task["id"]]
    waits = f"waits for it, in submission order; live tasks of the key: {', '.join(holders)}"
    return f"{key} ({waits})" if holders else f"{key} (waits for its admission)"


#: Page calls of a distributed map shown at each end of its evidence; the others are counted.
PAGES_SHOWN = 3
#: The occurrence of a distributed map's page call: ``STEP#N/page/STEP#PAGE``.
_PAGE_CALL = re.compile(r"^([^/#]+)#\d+/page/\1#\d+$")


def _evidence_shown(rows: list[dict[str, Any]]) -> list[dict[str, Any] | str]:
    """The evidence rows to print, a distributed map's page calls shortened.

    A large map makes thousands (``each#1/page/each#N``): the first and last few are shown,
    with how many are left out between.
    """
    pages = [i for i, row in enumerate(rows) if _PAGE_CALL.match(str(row["occurrence"]))]
    if len(pages) <= 2 * PAGES_SHOWN + 1:
        return list(rows)
    hidden = set(pages[PAGES_SHOWN:-PAGES_SHOWN])
    shown: list[dict[str, Any] | str] = []
    for i, row in enumerate(rows):
        if i not in hidden:
            shown.append(row)
        elif i == pages[PAGES_SHOWN]:
            shown.append(f"... {len(hidden):,} more page calls (toolkit show --json lists them)")
    return shown


async def _map_progress(store: Store, task: Any) -> str | None:
    """A distributed map's progress, while the task is at one (its checkpoint's wait)."""
    wait = task.checkpoint.get("wait") if task.state not in ("succeeded", "failed") else None
    if not isinstance(wait, dict) or not isinstance(wait.get("map"), dict):
        return None
    listed = wait["map"]
    progress = await store.map_items.progress(
        task.id, wait["occurrence"], listed["listed"], tenant=task.tenant
    )
    stage = "listing" if listed.get("listing") else "all listed"
    return (
        f"{wait['occurrence']}: {listed['listed']:,} items ({stage}) in {listed['tasks']:,}"
        f" child tasks, {progress.live:,} live, {progress.failed:,} items failed"
    )


def _awaited(name: str) -> str:
    """A signal name as a wait takes it: an event's (``event:NAME``) shown as the event."""
    if name.startswith("event:"):
        return f"event {name.split(':', 1)[1]!r}"
    return f"signal {name!r}"


def _wait_text(wait: dict[str, Any]) -> str:
    """What a waiting task waits for, from its checkpoint's ``wait``."""
    if "signal" in wait:
        return _awaited(str(wait["signal"]))
    if "child" in wait:
        return f"child task {wait['child']}"
    if "budget" in wait:
        return f"budget (deferral {wait['budget']})"
    if "limit" in wait:
        scope = f" of tenant {wait['scope']}" if wait.get("scope") else ""
        return f"limit {wait['limit']!r}{scope} (deferral {wait.get('deferrals', 1)})"
    if "callback" in wait:
        return "a callback"
    if "signals" in wait:
        return "the first of " + ", ".join(_awaited(str(name)) for name in wait["signals"])
    if "branches" in wait:
        return "its waiting branches (below)"
    if isinstance(wait.get("map"), dict):
        return _map_text(wait)
    return "timer"


def _map_text(wait: dict[str, Any]) -> str:
    """A distributed map's wait: its child tasks (``toolkit tasks --parent``)."""
    listed = wait["map"]
    return (
        f"the {listed.get('tasks', 0):,} child tasks of {wait['occurrence']} "
        f"({listed.get('listed', 0):,} items; toolkit tasks --parent lists them)"
    )


def _budget_lines(checkpoint: dict[str, Any]) -> list[str]:
    """The task's budget: limit, spent and reserved per resource."""
    return [
        f"  budget:     {resource}: spent {entry['spent']:g} of {entry['limit']:g}"
        + (f", {entry['reserved']:g} reserved" if entry["reserved"] else "")
        for resource, entry in sorted((checkpoint.get("budget") or {}).items())
    ]


def _fanout_lines(fanout: dict[str, Any] | None, branches: list[dict[str, Any]]) -> list[str]:
    """The parallel or map step in progress: reservation, winner, each branch's progress.

    ``branches``: the task's stored branch rows (``store.branches.of_task``); a format-1
    checkpoint still holds its branches inline until its task's next write.
    """
    if not fanout:
        return []
    lines = [f"  branches:   of {fanout['occurrence']}, {fanout.get('started', 0)} begun, "
             f"{fanout.get('ended', 0)} ended"]  # fmt: skip
    if fanout.get("reserved"):
        spent = fanout.get("spent") or {}
        lines.append(
            "    reserved  "
            + ", ".join(
                f"{resource} {amount:g} (spent {spent.get(resource, 0):g})"
                for resource, amount in sorted(fanout["reserved"].items())
            )
        )
    if fanout.get("winner"):
        lines.append(f"    winner    {fanout['winner']}")
    rows = [
        (row["name"], row["frame"], row["run_at"])
        for row in branches
        if row["fanout"] == fanout["occurrence"]
    ]
    rows += [(name, frame, None) for name, frame in (fanout.get("branches") or {}).items()]
    return lines + _branch_lines(rows, branches, "    ")


def _branch_lines(
    rows: list[tuple[str, dict[str, Any], Any]], branches: list[dict[str, Any]], indent: str
) -> list[str]:
    """One line per branch (name, status, where, spend).

    A branch's nested parallel or map step follows it, indented, with its own branches.
    """
    lines = []
    for name, branch, run_at in rows:
        where = f"at {branch['cursor']}" if branch["cursor"] else ""
        if branch.get("pending"):
            where += f", uncertain {branch['pending']}"
        if branch["status"] == "waiting" and branch.get("wait"):
            where += f", waits for {_wait_text(branch['wait'])}"
            where += f" until {run_at}" if run_at else ""
        spent = ", ".join(f"{r} {a:g}" for r, a in sorted((branch.get("spent") or {}).items()))
        spent = f" spent {spent}" if spent else ""
        lines.append(f"{indent}{name:<9} {branch['status']:<9} {where}{spent}")
        nested = branch.get("fanout")
        if nested:
            lines.append(f"{indent}  of {nested['occurrence']}, {nested.get('started', 0)} begun,"
                         f" {nested.get('ended', 0)} ended")  # fmt: skip
            inner = [
                (row["name"], row["frame"], row["run_at"])
                for row in branches
                if row["fanout"] == nested["occurrence"]
            ]
            lines += _branch_lines(inner, branches, indent + "  ")
    return lines
