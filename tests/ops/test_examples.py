"""The example application's pure logic and the shipped demo data, without a database; and
the README's commands that run each example once, against the test database."""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.inprocess import invoke
from toolkit.application import EffectContext
from toolkit.definition import load_definitions
from toolkit.examples import app, ingest, orders
from toolkit.examples.ingest import DataError, SourceChanged
from toolkit.examples.orders import OrderError
from toolkit.ops.demo import INGEST, ORDERS, ingest_inputs, order_inputs

ROOT = Path(__file__).resolve().parents[2]
DEFINITIONS = ROOT / "definitions"
DATA = DEFINITIONS / "data"

CSV = """date,temp_c,rain_mm,note
2024-01-30,1.5,0.0,dry
2024-01-31,-2.5,,snow

2024-02-01,4.0,3.2,rain
"""


@contextlib.asynccontextmanager
async def _no_connection() -> AsyncIterator[Any]:
    raise AssertionError("this handler must not use the database")
    yield  # pragma: no cover


def make_ctx(key: str = "7:step") -> EffectContext:
    return EffectContext(
        task_id=7,
        tenant="t",
        workflow=("wf", 1),
        step="step",
        occurrence="step",
        attempt=1,
        fencing_token=1,
        idempotency_key=key,
        _connection=_no_connection,
    )


# --- CSV parsing ---------------------------------------------------------------------------------


def test_parse_csv_reads_header_rows_and_skips_blank_lines() -> None:
    table = ingest.parse_csv(CSV)
    assert table.columns == ("date", "temp_c", "rain_mm", "note")
    assert len(table.rows) == 3
    assert table.cells("rain_mm") == ["0.0", "", "3.2"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("a,a\n1,2\n", "distinct"),
        ("a,\n1,2\n", "non-blank"),
        ("a,b\n1,2\n3\n", "line 3 has 1 cells"),
    ],
)
def test_parse_csv_refuses_malformed_tables(text: str, fragment: str) -> None:
    with pytest.raises(DataError, match=fragment):
        ingest.parse_csv(text, source="x.csv")


def test_unknown_column_is_a_data_error() -> None:
    with pytest.raises(DataError, match="no column 'wind'"):
        ingest.parse_csv(CSV).cells("wind")


def test_to_number() -> None:
    assert ingest.to_number("") is None
    assert ingest.to_number("-2.5") == -2.5
    with pytest.raises(ValueError):
        ingest.to_number("nan")
    with pytest.raises(ValueError):
        ingest.to_number("dry")


def test_read_table_refuses_non_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes("name\nZürich\n".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8"):
        ingest.read_table(path)


# --- profile and aggregates ----------------------------------------------------------------------


def test_profile_finds_numeric_columns_missing_cells_and_dates() -> None:
    profile = ingest.profile_table(ingest.parse_csv(CSV))
    assert profile == {
        "columns": ["date", "temp_c", "rain_mm", "note"],
        "rows": 3,
        "numeric": ["temp_c", "rain_mm"],
        "missing": {"date": 0, "temp_c": 0, "rain_mm": 1, "note": 0},
        "missing_cells": 1,
        "date_column": "date",
        "first_date": "2024-01-30",
        "last_date": "2024-02-01",
    }


def test_profile_of_a_header_only_file() -> None:
    profile = ingest.profile_table(ingest.parse_csv("a,b\n"))
    assert profile["rows"] == 0
    assert profile["numeric"] == []
    assert profile["date_column"] is None


def test_summarize_ignores_missing_values() -> None:
    assert ingest.summarize([1.0, None, 2.0, 4.0]) == {
        "count": 3,
        "missing": 1,
        "min": 1.0,
        "max": 4.0,
        "mean": 2.333,
        "median": 2.0,
        "stdev": 1.528,
        "sum": 7.0,
    }


def test_summarize_of_one_value_and_of_none() -> None:
    assert ingest.summarize([3.0])["stdev"] is None
    empty = ingest.summarize([None, None])
    assert empty["count"] == 0 and empty["missing"] == 2
    assert empty["mean"] is None and empty["sum"] is None


def test_aggregate_adds_monthly_means_for_dated_tables() -> None:
    result = ingest.aggregate_table(ingest.parse_csv(CSV), ["temp_c", "rain_mm"])
    assert result["temp_c"]["by_month"] == {"2024-01": -0.5, "2024-02": 4.0}
    assert result["rain_mm"]["by_month"] == {"2024-01": 0.0, "2024-02": 3.2}
    assert result["rain_mm"]["sum"] == 3.2


def test_aggregate_refuses_a_text_column() -> None:
    with pytest.raises(DataError, match="column 'note'"):
        ingest.aggregate_table(ingest.parse_csv(CSV), ["note"])


# --- reports -------------------------------------------------------------------------------------


def test_report_name_derives_from_the_input() -> None:
    assert ingest.report_name("data/oslo-2024.csv") == "oslo-2024.json"
    assert ingest.report_name("/x/oslo-2024.csv", ["wind_kmh"]) == "oslo-2024.wind_kmh.json"
    assert ingest.report_name("a b.csv", ["x/y"]) == "a_b.x_y.json"


def test_write_report_is_atomic_and_idempotent(tmp_path: Path) -> None:
    folder = tmp_path / "new" / "reports"
    first = ingest.write_report(folder, "r.json", {"b": 1, "a": [1.5]})
    second = ingest.write_report(folder, "r.json", {"b": 1, "a": [1.5]})
    assert first == second
    assert [p.name for p in folder.iterdir()] == ["r.json"]  # no temp file left behind
    assert json.loads((folder / "r.json").read_text()) == {"a": [1.5], "b": 1}
    assert first["path"] == str(folder / "r.json")
    assert first["bytes"] == (folder / "r.json").stat().st_size


def test_write_report_refuses_nan_and_leaves_no_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ingest.write_report(tmp_path, "r.json", {"x": float("nan")})
    assert list(tmp_path.iterdir()) == []


def test_ingest_handlers_end_to_end(tmp_path: Path) -> None:
    source = tmp_path / "station.csv"
    source.write_text(CSV)
    ctx = make_ctx()
    hashed = ingest.hash_file_handler(ctx, str(source))
    assert hashed["bytes"] == len(CSV.encode())
    assert len(hashed["sha256"]) == 64
    profile = ingest.profile_csv_handler(ctx, str(source), sha256=hashed["sha256"])
    aggregates = ingest.aggregate_csv_handler(
        ctx, str(source), columns=profile["numeric"], sha256=hashed["sha256"]
    )
    written = ingest.write_report_handler(
        ctx,
        report_dir=str(tmp_path / "reports"),
        source=str(source),
        report={"source": hashed, "profile": profile, "aggregates": aggregates},
        columns=None,
    )
    assert Path(written["path"]).name == "station.json"
    report = json.loads(Path(written["path"]).read_text())
    assert report["aggregates"]["temp_c"]["count"] == 3


def test_a_file_changed_after_hashing_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "station.csv"
    source.write_text(CSV)
    digest = ingest.hash_file_handler(make_ctx(), str(source))["sha256"]
    source.write_text(CSV + "2024-02-02,1,1,x\n")
    with pytest.raises(SourceChanged):
        ingest.profile_csv_handler(make_ctx(), str(source), sha256=digest)


# --- orders --------------------------------------------------------------------------------------


def test_price_order_uses_exact_decimals() -> None:
    priced = orders.price_order(
        [{"sku": "A", "qty": 3, "price": 0.1}, {"sku": "B", "qty": 1, "price": 19.99}]
    )
    assert priced.total == Decimal("20.29")
    assert priced.units == 4
    assert [line["amount"] for line in priced.lines] == [0.3, 19.99]


@pytest.mark.parametrize(
    "items",
    [[], [{"sku": "A", "qty": 0, "price": 1}], [{"sku": "A", "qty": 1, "price": -1}]],
)
def test_price_order_refuses_bad_items(items: list[dict[str, Any]]) -> None:
    with pytest.raises(OrderError):
        orders.price_order(items)


def test_review_approves_ordinary_large_orders() -> None:
    review = orders.review_order(2500.0, [{"sku": "A", "qty": 10, "price": 250}])
    assert review == {"approved": True, "reasons": [], "risk": 0.1}


def test_review_gives_every_reason_to_reject() -> None:
    review = orders.review_order(
        30000,
        [{"sku": "A", "qty": 51, "price": 1}, {"sku": "A", "qty": 1, "price": 1}],
    )
    assert review["approved"] is False
    assert review["risk"] == 1.0
    assert len(review["reasons"]) == 3


def test_shipping_is_deterministic() -> None:
    assert orders.tracking_number("9:ship", "no") == orders.tracking_number("9:ship", "NO")
    assert orders.tracking_number("9:ship", "NO") != orders.tracking_number("10:ship", "NO")
    assert orders.tracking_number("9:ship", "NO").endswith("NO")
    assert orders.carrier_for("se") == "PostNord"
    assert orders.carrier_for("US") == "DHL Express"


async def _review(**args: Any) -> dict[str, Any]:
    result: dict[str, Any] = await orders.review_handler(make_ctx(), **args)
    return result


@pytest.mark.anyio
async def test_review_handler_needs_no_database() -> None:
    result = await _review(order_id="ORD-1", total=10.0, items=[{"sku": "A", "qty": 1}])
    assert result["approved"] is True and result["order_id"] == "ORD-1"


# --- the app, the definitions and the shipped data ----------------------------------------------


def test_the_app_serves_every_example_definition() -> None:
    definitions = load_definitions([DEFINITIONS])
    assert {INGEST, ORDERS} <= {d.name for d in definitions}
    app.check(definitions)


def test_shipped_data_is_small() -> None:
    size = sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file())
    assert size < 300_000


def test_every_shipped_csv_file_is_a_complete_year() -> None:
    files = sorted(DATA.rglob("*.csv"))
    assert len(files) == 12
    for path in files:
        profile = ingest.profile_table(ingest.read_table(path))
        assert profile["rows"] == 366, path
        assert len(profile["numeric"]) == 5, path
        assert (profile["first_date"], profile["last_date"]) == ("2024-01-01", "2024-12-31")


def test_demo_inputs_match_the_definitions(tmp_path: Path) -> None:
    by_name = {d.name: d for d in load_definitions([DEFINITIONS])}
    ingest_tasks = ingest_inputs(DATA, tmp_path)
    order_tasks = order_inputs(DATA / "orders.jsonl")
    assert len(ingest_tasks) == 12 * 6
    assert len(order_tasks) == 300
    assert len({ingest.report_name(i["path"], i.get("columns")) for i in ingest_tasks}) == 72
    for value in ingest_tasks:
        by_name[INGEST].validate_input(value)
    for value in order_tasks:
        by_name[ORDERS].validate_input(value)


def test_no_shipped_order_takes_a_failing_branch() -> None:
    for order in order_inputs(DATA / "orders.jsonl"):
        total = orders.price_order(order["items"]).total
        assert orders.review_order(total, order["items"])["approved"], order["order_id"]


# --- the README's commands ----------------------------------------------------------------------


def _readme_example_commands() -> list[list[str]]:
    """The README's block that runs each example once, as ``toolkit`` arguments."""
    text = (ROOT / "README.md").read_text()
    start = text.index("toolkit deploy --app toolkit.examples definitions/")
    block = text[start : text.index("```", start)]
    return [shlex.split(line)[1:] for line in block.splitlines() if line.strip()]


def test_the_readme_runs_a_valid_task_of_every_example(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the README said `toolkit run --app toolkit.examples` runs the examples,
    but nothing submitted tasks of them. Each submit line must pass its input schema, and the
    worker must finish each task (the approval waits for its callback and a person)."""
    shutil.copytree(DEFINITIONS, tmp_path / "definitions")  # the reports go under tmp_path
    monkeypatch.chdir(tmp_path)
    commands = _readme_example_commands()
    submitted = [args[1] for args in commands if args[0] == "submit"]
    assert sorted(submitted) == sorted(d.name for d in load_definitions([DEFINITIONS]))
    ids = {}
    for args in commands:
        code, out, err = invoke(dsn, *args)
        assert code == 0, (args, err)
        if args[0] == "submit":
            ids[args[1]] = int(out)

    def shown(name: str) -> dict[str, Any]:
        return dict(json.loads(invoke(dsn, "show", str(ids[name]), "--json")[1])["task"])

    states = {name: (shown(name)["state"], shown(name)["wait_reason"]) for name in ids}
    assert states.pop("approval-callback") == ("waiting", "callback")
    for waits in ("parallel-approvals", "ci-pipeline"):  # for their branches' signals
        assert states.pop(waits) == ("waiting", "branches"), waits
    # the restores wait for callbacks that time out after 3 s: done, if the run took longer
    assert states.pop("restore-files") in {("waiting", "branches"), ("succeeded", None)}
    assert set(states.values()) == {("succeeded", None)}, states
    # The README's last steps: the callback's completion, the person's signal, a worker.
    callbacks = shown("approval-callback")["checkpoint"]["callbacks"]
    (token,) = [callback["token"] for callback in callbacks.values()]
    task = str(ids["approval-callback"])
    for args in (
        ["complete", token, "--result", "{}"],
        ["signal", task, "approved", "--payload", '{"by": "maria"}'],
        ["run", "--app", "toolkit.examples", "--definitions", "definitions/", "--until-idle"],
    ):
        code, _, err = invoke(dsn, *args)
        assert code == 0, (args, err)
    assert shown("approval-callback")["state"] == "succeeded"
