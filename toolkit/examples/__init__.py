"""The example application: the handlers of the definitions in ``definitions/``.

``app`` serves ``file-ingest`` (hash, profile, aggregate a CSV file and write a JSON
report), ``order-saga`` (reserve, review large orders, charge, ship), the composition
examples (a model-call race, a batch map, a parent order with a child payment), the saga,
approval and polling examples, and those whose branches wait (parallel approvals, a poll
racing a deadline, file restores, a CI pipeline). Run it with ``toolkit run --app
toolkit.examples`` or ``toolkit demo``. The order saga writes the application tables created by
:func:`ensure_example_tables`.
"""

from __future__ import annotations

from toolkit.application import App
from toolkit.examples import composition, ingest, orders, saga, waiting
from toolkit.examples.orders import ensure_example_tables

__all__ = ["app", "ensure_example_tables"]

app = App("examples")
"""The example handlers, by the names the example definitions use."""

app.add("files.hash", ingest.hash_file_handler)
app.add("csv.profile", ingest.profile_csv_handler)
app.add("csv.aggregate", ingest.aggregate_csv_handler)
app.add("reports.write", ingest.write_report_handler)

app.add("inventory.reserve", orders.reserve_handler)
app.add("orders.review", orders.review_handler)
app.add("payments.charge", orders.charge_handler)
app.add("shipping.ship", orders.ship_handler)

app.add("composition.ask", composition.ask_handler)
app.add("composition.ask_slow", composition.ask_slow_handler)
app.add("composition.summarise", composition.summarise_handler)
app.add("composition.process_item", composition.process_item_handler)
app.add("composition.charge", composition.charge_handler)

app.add("examples.reserve_stock", saga.reserve_stock_handler)
app.add("examples.release_stock", saga.release_stock_handler)
app.add("examples.charge_card", saga.charge_card_handler)
app.add("examples.refund_card", saga.refund_card_handler)
app.add("examples.notify", saga.notify_handler)
app.add("examples.request_approval", saga.request_approval_handler)
app.add("examples.check_status", saga.check_status_handler)
app.limit("examples.status-api", rate="120/min", burst=10)

app.add("examples.request_restore", waiting.request_restore_handler)
app.add("examples.run_tests", waiting.run_tests_handler)
