"""One submit's overrides of a definition's flow control (issue 20, docs/flow-control.md):
the values change for the tasks of that submit, the key and the registered version do not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.inprocess import sql
from tests.helpers.workflows import THREE_STEPS, definition
from tests.store.test_concurrency_keys import keyed
from tests.store.test_debounce_throttle import DEBOUNCED, throttled
from tests.store.test_tenants import invoke
from toolkit.definition import WorkflowDefinition
from toolkit.definition.flow_overrides import FlowOverrides
from toolkit.errors import InputError, Throttled
from toolkit.store import Store

pytestmark = pytest.mark.anyio


async def _deployed(store: Store, text: str) -> WorkflowDefinition:
    d = definition(text)
    await store.definitions.deploy(d)
    return d


async def _start_in(store: Store, task_id: int) -> float:
    """Seconds from the task's submit to its start (run_at)."""
    (row,) = await sql(
        store, "SELECT extract(epoch FROM run_at - created_at)::float8 FROM toolkit_tasks"
        " WHERE id = %s", task_id,
    )  # fmt: skip
    return float(row[0])


async def test_a_submit_shortens_the_quiet_period_of_its_key(store: Store) -> None:
    d = await _deployed(store, DEBOUNCED.replace("QUIET", "1h").replace("MAX_WAIT", "2h"))
    (declared,) = await store.tasks.submit(d, [{"document": "a"}])
    (quick,) = await store.tasks.submit(FlowOverrides(quiet=2).applied(d), [{"document": "b"}])
    assert round(await _start_in(store, declared)) == 3600
    assert round(await _start_in(store, quick)) == 2
    assert (await store.tasks.get(quick)).definition_digest == d.digest  # the same version


async def test_a_submit_changes_the_rate_and_the_excess_of_a_throttle(store: Store) -> None:
    d = await _deployed(store, throttled("1/h"))
    # three starts an hour: all three at once, and the next start an hour away however
    # long the submits take (a rate per second would free one in milliseconds)
    fast = FlowOverrides(rate="3/h").applied(d)
    ids = await store.tasks.submit(fast, [{"customer": "c"}] * 3)
    assert [round(await _start_in(store, i)) for i in ids] == [0, 0, 0]
    with pytest.raises(Throttled):
        await store.tasks.submit(FlowOverrides(excess="refuse").applied(d), [{"customer": "c"}])


async def test_a_submit_raises_the_max_active_of_its_key(store: Store) -> None:
    d = await _deployed(store, keyed())
    ids = await store.tasks.submit(FlowOverrides(max_active=2).applied(d), [{"account": "a"}] * 2)
    states = [(await store.tasks.get(i)).state for i in ids]
    assert states == ["queued", "queued"], states
    (parked,) = await store.tasks.submit(d, [{"account": "a"}])
    task = await store.tasks.get(parked)
    assert (task.state, task.wait_reason) == ("waiting", "concurrency"), task


@pytest.mark.parametrize(
    ("overrides", "path", "message"),
    [
        (FlowOverrides(quiet=5), "$.flow.quiet", "declares no debounce"),
        (FlowOverrides(max_active=2), "$.flow.max_active", "declares no concurrency"),
        (FlowOverrides(rate="10/min"), "$.flow.rate", "declares no throttle"),
    ],
)
def test_an_override_of_a_control_not_declared_is_refused(
    overrides: FlowOverrides, path: str, message: str
) -> None:
    with pytest.raises(InputError, match=message) as info:
        overrides.applied(definition(THREE_STEPS))
    assert info.value.path == path


def test_an_override_out_of_range_is_refused() -> None:
    debounced = definition(DEBOUNCED.replace("QUIET", "1m").replace("MAX_WAIT", "1h"))
    with pytest.raises(InputError, match="greater than zero") as info:
        FlowOverrides(max_wait=0).applied(debounced)
    assert info.value.path == "$.flow.max_wait"
    with pytest.raises(InputError, match="is not a rate") as info:
        FlowOverrides(rate="0/min").applied(definition(throttled("1/h")))
    assert info.value.path == "$.flow.rate"


def test_cli_submit_overrides_the_quiet_period(dsn: str, tmp_path: Path) -> None:
    (tmp_path / "debounced.yaml").write_text(
        DEBOUNCED.replace("QUIET", "1h").replace("MAX_WAIT", "2h")
    )
    (tmp_path / "three.yaml").write_text(THREE_STEPS)
    assert invoke(dsn, "deploy", str(tmp_path))[0] == 0
    code, out, err = invoke(
        dsn, "submit", "debounced", "--input", '{"document": "a"}', "--quiet", "3s"
    )
    assert code == 0 and out.strip().isdigit(), (out, err)
    code, out, err = invoke(dsn, "submit", "three-steps", "--quiet", "3s")
    assert code != 0 and "declares no debounce" in err and len(err.splitlines()) == 1, err
