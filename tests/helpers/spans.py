"""Spans written as they end, one JSON line each, per process (issue 23's tests).

A simple span processor exports each span the moment it ends, so a worker that is
SIGKILLed keeps, in its file, every span that had ended before.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

#: Where a process configured by :func:`install_from_environment` writes its spans.
SPAN_DIR = "TEST_SPAN_DIR"


class JsonLinesExporter(SpanExporter):
    """Append each span to ``path`` as one JSON object per line."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._path.open("a") as out:
            for span in spans:
                out.write(json.dumps(_as_json(span)) + "\n")
                out.flush()
        return SpanExportResult.SUCCESS


def _as_json(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "kind": span.kind.name,
        "attributes": dict(span.attributes or {}),
        "links": [_link_json(link) for link in span.links],
        "status": span.status.status_code.name,
        "start": span.start_time,
        "end": span.end_time,
        "pid": os.getpid(),
    }


def _link_json(link: Any) -> dict[str, Any]:
    return {
        "trace_id": f"{link.context.trace_id:032x}",
        "span_id": f"{link.context.span_id:016x}",
        "attributes": dict(link.attributes or {}),
    }


def install_from_environment() -> None:
    """Configure this process's tracer provider to write ``$TEST_SPAN_DIR/spans-PID.jsonl``.

    Nothing happens when the variable is not set.
    """
    folder = os.environ.get(SPAN_DIR)
    if not folder:
        return
    provider = TracerProvider()
    exporter = JsonLinesExporter(Path(folder) / f"spans-{os.getpid()}.jsonl")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


@dataclasses.dataclass(frozen=True)
class Spans:
    """The spans of a folder of span files, read back."""

    spans: list[dict[str, Any]]

    @classmethod
    def read(cls, folder: Path, pid: int | None = None) -> Spans:
        """Every span of the files in ``folder`` (of process ``pid`` only, if given)."""
        pattern = f"spans-{pid}.jsonl" if pid is not None else "spans-*.jsonl"
        spans = [
            json.loads(line)
            for path in sorted(folder.glob(pattern))
            for line in path.read_text().splitlines()
        ]
        return cls(spans)

    def named(self, name: str, **attributes: Any) -> list[dict[str, Any]]:
        """The spans called ``name`` whose ``runifold.`` attributes include ``attributes``."""
        return [
            span for span in self.spans
            if span["name"] == name
            and all(span["attributes"].get(f"runifold.{k}") == v for k, v in attributes.items())
        ]  # fmt: skip

    def children(self, parent: dict[str, Any]) -> list[dict[str, Any]]:
        """The spans whose parent is ``parent``, in start order."""
        found = [span for span in self.spans if span["parent_id"] == parent["span_id"]]
        return sorted(found, key=lambda span: span["start"])

    def tree(self) -> str:
        """The spans as an indented tree (for a failing test's message)."""
        ids = {span["span_id"] for span in self.spans}
        lines: list[str] = []

        def show(span: dict[str, Any], depth: int) -> None:
            outcome = span["attributes"].get("runifold.outcome", "")
            lines.append(f"{'  ' * depth}{span['name']} [{outcome}] {span['span_id']}")
            for child in self.children(span):
                show(child, depth + 1)

        for root in sorted(self.spans, key=lambda span: span["start"]):
            if root["parent_id"] not in ids:
                show(root, 0)
        return "\n".join(lines)


def waterfall_svg(spans: Spans, trace_id: str, title: str) -> str:
    """The spans of trace ``trace_id`` drawn as a waterfall, one row per span in tree order
    (a Jaeger-style view), as SVG text."""
    rows: list[tuple[int, dict[str, Any]]] = []
    ours = [span for span in spans.spans if span["trace_id"] == trace_id]
    ids = {span["span_id"] for span in ours}

    def walk(span: dict[str, Any], depth: int) -> None:
        rows.append((depth, span))
        for child in spans.children(span):
            walk(child, depth + 1)

    for root in sorted(ours, key=lambda span: span["start"]):
        if root["parent_id"] not in ids:
            walk(root, 0)
    start = min(span["start"] for _, span in rows)
    total = max(span["end"] for _, span in rows) - start or 1
    label_width, bar_width, height = 300, 560, 22
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_width + bar_width + 90}" '
        f'height="{height * (len(rows) + 2)}" font-family="sans-serif" font-size="12">',
        f'<text x="8" y="16" font-weight="bold">{escape(title)}</text>',
    ]
    for n, (depth, span) in enumerate(rows, start=1):
        y = height * n + 6
        x = label_width + bar_width * (span["start"] - start) / total
        width = max(1.5, bar_width * (span["end"] - span["start"]) / total)
        colour = "#5b8def" if span["name"].startswith("run ") else "#7cb77c"
        if span["status"] == "ERROR":
            colour = "#d9534f"
        outcome = escape(str(span["attributes"].get("runifold.outcome", "")))
        took = (span["end"] - span["start"]) / 1e6
        parts += [
            f'<text x="{8 + 14 * depth}" y="{y + 14}">{escape(span["name"])}</text>',
            f'<rect x="{x:.1f}" y="{y + 3}" width="{width:.1f}" height="{height - 8}" '
            f'fill="{colour}" rx="2"/>',
            f'<text x="{min(x + width + 4, label_width + bar_width + 4):.1f}" y="{y + 14}" '
            f'fill="#555">{took:.1f} ms {outcome}</text>',
        ]
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
