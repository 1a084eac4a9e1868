"""The four patterns of branches that wait, from ``definitions/``, with the demo's outside
world (``toolkit.ops.demo_patterns``) answering their waiting branches: in-process against
PostgreSQL, as ``toolkit demo`` runs them."""

from __future__ import annotations

import pytest

from tests.helpers.golden import EXAMPLES
from toolkit.definition import load_definitions
from toolkit.examples import app
from toolkit.ops.demo_patterns import LOST_FILES, pattern_definitions, run_patterns
from toolkit.store import Store

pytestmark = pytest.mark.anyio


async def test_the_four_patterns_run_from_the_examples(store: Store) -> None:
    definitions = pattern_definitions(load_definitions([EXAMPLES]))
    for definition in definitions:
        await store.definitions.deploy(definition)
    run = await run_patterns(store, definitions, app)
    outcomes = [(name, state, outcome) for name, _, state, outcome in run.tasks]
    # every task parked while all its live branches waited (its history says so)
    assert run.waited_without_lease == len(run.tasks) == 6, run
    (granted, refused) = [o for o in outcomes if o[0] == "parallel-approvals"]
    assert granted[1] == "succeeded", granted
    assert set(granted[2]["approvals"]) == {"legal", "finance", "security"}
    assert refused[1] == "failed" and refused[2]["name"] == "Request Refused", refused
    assert "finance rejected request REQ-2" in refused[2]["message"], refused
    (in_time, too_late) = [o for o in outcomes if o[0] == "poll-or-deadline"]
    assert in_time[1:] == ("succeeded", {"job_id": "job-2", "result": {"job_id": "job-2",
                                                                       "checks": 2}}), in_time
    assert too_late[1:] == ("succeeded", {"job_id": "job-9", "gave_up": True}), too_late
    ((_, state, restored),) = [o for o in outcomes if o[0] == "restore-files"]
    assert state == "succeeded", restored
    lost = [item["file"] for item in restored["files"] if not item["restored"]]
    assert sorted(lost) == sorted(LOST_FILES), restored
    ((_, state, deployed),) = [o for o in outcomes if o[0] == "ci-pipeline"]
    assert state == "succeeded", deployed
    assert deployed == {"to": "release", "sent": True}, deployed
    # REQ-1's three approvals, REQ-2's rejection (and its other approvers', if they parked
    # before it was read), the go-ahead
    assert 5 <= run.signals <= 7, run
    assert run.completions == 8, run
    assert "branches that wait" in "\n".join(run.lines())
