"""Error names (``toolkit.definition.policies``, issue 18): any text of 1 to 200 characters
without a control character, compared exactly; ``*`` alone is any error, in catch and retry
``errors`` only. The Python rule and the schema's ``$defs/errorName`` agree, and the model,
the checks and the drawings take such names as written."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from tests.helpers.workflows import CORPUS
from toolkit.definition import (
    CatchRule,
    EffectStep,
    FailStep,
    RetryPolicy,
    catch_target,
    load_definition,
    parse_definition,
    schema_path,
)
from toolkit.definition.diagram import mermaid
from toolkit.definition.policies import MAX_ERROR_NAME, error_name_problem
from toolkit.definition.svg import svg
from toolkit.errors import DefinitionError

NAMES = [
    "OutOfStock", "payments.Declined", "missing-order-id", "Job Failed", "States.Timeout",
    "404", "a", " ", "Rate limit: slow down", "ödeme reddedildi", "名前", "x" * MAX_ERROR_NAME,
    "a..b", "a.", ".a", "Job\u00a0Failed", 'say "no"',
]  # fmt: skip
NOT_NAMES = [
    "", "x" * (MAX_ERROR_NAME + 1), "a\tb", "a\nb", "Job Failed\n", "\x00", "a\x1bb", "a\x7f",
    "a\x85b", "\x9f",
]  # fmt: skip


def _validator(definition: str) -> Draft202012Validator:
    schema = json.loads(schema_path().read_text(encoding="utf-8"))
    return Draft202012Validator({"$ref": f"#/$defs/{definition}", "$defs": schema["$defs"]})


@pytest.mark.parametrize("name", NAMES)
def test_any_text_without_a_control_character_is_an_error_name(name: str) -> None:
    assert error_name_problem(name) is None
    assert _validator("errorName").is_valid(name)
    assert _validator("errorMatch").is_valid(name)


@pytest.mark.parametrize("name", NOT_NAMES)
def test_empty_long_or_control_character_names_are_refused(name: str) -> None:
    assert error_name_problem(name) is not None
    assert error_name_problem(name, wildcard=True) is not None
    assert not _validator("errorName").is_valid(name)
    assert not _validator("errorMatch").is_valid(name)


def test_a_star_is_any_error_and_no_error_s_name() -> None:
    assert error_name_problem("*", wildcard=True) is None
    assert error_name_problem("*") == "it stands for any error, in catch and retry errors only"
    assert _validator("errorMatch").is_valid("*") and not _validator("errorName").is_valid("*")
    assert error_name_problem("**") is None and error_name_problem("*x") is None
    assert error_name_problem(7) == "it is not a string"


def test_error_names_are_matched_exactly() -> None:
    rule = CatchRule(errors=("missing-order-id", "Job Failed"), next="no_order")
    assert rule.matches("missing-order-id") and rule.matches("Job Failed")
    for other in ("Missing-Order-Id", "job failed", "Job  Failed", "Job Failed ", "Job"):
        assert not rule.matches(other)
    assert catch_target([CatchRule(("**",), "stars")], "Timeout") is None  # only "*" is any
    policy = RetryPolicy(errors=("States.Timeout",), non_retryable=("Job Failed",))
    assert policy.applies_to("States.Timeout") and not policy.applies_to("states.timeout")
    anything = RetryPolicy(non_retryable=("Job Failed",))
    assert anything.applies_to("Job failed") and not anything.applies_to("Job Failed")


def test_the_model_keeps_error_names_as_written() -> None:
    d = load_definition(CORPUS / "valid" / "error-names.yaml")
    lookup = d.steps["lookup"]
    assert isinstance(lookup, EffectStep)
    assert lookup.catch == (
        CatchRule(("missing-order-id",), "no_order"),
        CatchRule(("Job Failed", "ödeme reddedildi", "404"), "failed"),
    )
    timeout = lookup.retry_policy("States.Timeout")
    assert timeout is not None and timeout.max_attempts == 5
    assert lookup.retry_policy("Rate limit: slow down") == timeout
    assert lookup.retry_policy("missing-order-id") is None  # non_retryable of the "*" policy
    other = lookup.retry_policy("Other")
    assert other is not None and other.max_attempts == 2
    failed = d.steps["failed"]
    assert isinstance(failed, FailStep) and failed.error == "Job Failed"
    assert d.handlers() == frozenset({"orders.lookup", "billing.charge"})


SHADOWED = """
name: shadowed
version: 1
start: a
steps:
  a:
    effect: h.a
    idempotent: true
    retry:
      - {errors: [Job Failed, missing-order-id]}
      - {errors: [missing-order-id]}
    catch:
      - {errors: [Job Failed], next: b}
      - {errors: [Job Failed], next: b}
      - {errors: [job failed], next: b}
  b: {fail: {error: Job Failed}}
"""


def test_the_checks_beyond_the_schema_compare_names_exactly() -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_definition(SHADOWED, source="<shadowed>")
    assert [str(f) for f in caught.value.faults] == [
        "<shadowed>:11: $.steps.a.retry[1]: this policy never applies: earlier policies"
        " already cover 'missing-order-id'",
        "<shadowed>:14: $.steps.a.catch[1]: this rule never matches: earlier rules already"
        " catch 'Job Failed'",
    ]  # the rule for `job failed` is another name, not shadowed


DRAWN = """
name: drawn
version: 1
start: a
steps:
  a:
    effect: h.a
    idempotent: true
    catch:
      - {errors: [no-order, "Job Failed", "a, b"], next: b}
      - {errors: ["*"], next: c}
  b: {fail: {error: Job Failed}}
  c: {fail: {error: missing-order-id}}
"""


def test_drawings_quote_an_error_name_that_is_not_plain() -> None:
    d = parse_definition(DRAWN)
    body = mermaid(d)
    # Mermaid's entity for a quote: the label reads catch no-order, "Job Failed", "a, b".
    assert '-.->|"catch no-order, #quot;Job Failed#quot;, #quot;a, b#quot;"|' in body
    assert '-.->|"catch *"|' in body
    assert "fail #quot;Job Failed#quot;" in body and "fail missing-order-id" in body
    picture = svg(d)
    assert "catch no-order, &quot;Job Failed&quot;, &quot;a, b&quot;" in picture
