"""Definition versions and safe deploys, and idempotent submits (docs/operations.md)."""

from __future__ import annotations

import pytest

from tests.helpers.inprocess import drain
from tests.helpers.workflows import THREE_STEPS, V1, definition
from toolkit.errors import DefinitionInUse, DefinitionRetired, SubmitConflict, UnknownDefinition
from toolkit.store import Store

pytestmark = pytest.mark.anyio

V2 = THREE_STEPS.replace("version: 1", "version: 2").replace(
    "succeed: {output: zero}", "succeed: {output: nil}"
)


async def test_old_version_task_waits_for_a_worker_that_has_its_version(store: Store) -> None:
    v1, v2 = definition(V1), definition(V2)
    await store.definitions.deploy(v1)
    (old_task,) = await store.tasks.submit(
        await store.definitions.submittable("three-steps"), [{"n": 1}]
    )
    await store.definitions.deploy(v2)
    (new_task,) = await store.tasks.submit(
        await store.definitions.submittable("three-steps"), [{"n": 2}]
    )
    assert (await store.tasks.get(old_task)).definition_version == 1  # pinned at submit
    assert (await store.tasks.get(new_task)).definition_version == 2  # latest by default

    await drain(store, V2)  # a worker with only the new version
    assert (await store.tasks.get(new_task)).state == "succeeded"
    assert (await store.tasks.get(old_task)).state == "queued"  # never run on v2
    entries = {(e.name, e.version): e for e in await store.definitions.list()}
    assert entries[("three-steps", 1)].unavailable == 1  # nothing live serves v1

    await drain(store, V1)
    old = await store.tasks.get(old_task)
    assert old.state == "succeeded" and old.definition_digest == v1.digest


async def test_delete_is_refused_while_live_tasks_reference_the_version(store: Store) -> None:
    d = definition(V1)
    await store.definitions.deploy(d)
    await store.tasks.submit(d, [{"n": 1}, {"n": 2}])
    with pytest.raises(DefinitionInUse, match=r"\(2 queued\)"):
        await store.definitions.delete("three-steps", 1)
    await drain(store, V1)
    await store.definitions.delete("three-steps", 1)
    with pytest.raises(UnknownDefinition):
        await store.definitions.get("three-steps", 1)
    with pytest.raises(UnknownDefinition):
        await store.definitions.delete("three-steps", 1)
    assert (await store.tasks.counts_by_state()) == {"succeeded": 2}  # history stays


async def test_retired_version_takes_no_new_submissions(store: Store) -> None:
    await store.definitions.deploy(definition(V1))
    await store.definitions.deploy(definition(V2))
    await store.definitions.retire("three-steps", 2)
    assert (await store.definitions.submittable("three-steps")).version == 1
    with pytest.raises(DefinitionRetired, match="version 2 is retired"):
        await store.definitions.submittable("three-steps", 2)
    # Every version retired: the refusal says so (not "deploy it") and names the newest.
    await store.definitions.retire("three-steps", 1)
    with pytest.raises(DefinitionRetired, match="every version of 'three-steps' is retired"):
        await store.definitions.submittable("three-steps")
    await store.definitions.restore("three-steps", 2)
    assert (await store.definitions.submittable("three-steps")).version == 2
    with pytest.raises(UnknownDefinition):
        await store.definitions.restore("three-steps", 3)
    with pytest.raises(UnknownDefinition, match="run `toolkit deploy`"):
        await store.definitions.submittable("never-deployed")


async def test_submit_with_an_idempotency_key(store: Store) -> None:
    v1, v2 = definition(V1), definition(V2)
    await store.definitions.deploy(v1)
    await store.definitions.deploy(v2)
    first = await store.tasks.submit_keyed(v1, {"n": 1}, key="order-7", tenant="shop")
    again = await store.tasks.submit_keyed(v1, {"n": 1}, key="order-7", tenant="shop")
    other_tenant = await store.tasks.submit_keyed(
        v1, {"n": 1}, key="order-7", tenant="o'brien; DROP"
    )
    assert first[1] and again == (first[0], False)
    assert other_tenant[1] and other_tenant[0] != first[0]
    with pytest.raises(SubmitConflict, match="three-steps version 1") as info:
        await store.tasks.submit_keyed(v2, {"n": 1}, key="order-7", tenant="shop")
    assert info.value.task_id == first[0]
    assert (await store.tasks.get(other_tenant[0])).tenant == "o'brien; DROP"
