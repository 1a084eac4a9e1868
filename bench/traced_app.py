"""The benchmark's no-op handlers in a worker that records every span (``bench/tracing.py``).

The OpenTelemetry SDK with a batch span processor, as an application would configure it, and
an exporter that drops what it is given: the cost measured is runifold's instrumentation,
the SDK's spans and the per-cycle ``trace_attempt`` write, not an exporter's network.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from bench.noop_app import app as app


class Dropping(SpanExporter):
    """Accept every span and keep none."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(BatchSpanProcessor(Dropping()))
trace.set_tracer_provider(_provider)
