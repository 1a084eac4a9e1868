"""OpenTelemetry traces of tasks (docs/tracing.md; DESIGN, "Traces and progress").

The OpenTelemetry API is an optional extra (``pip install runifold[otel]``). Without it,
every function here does nothing and no OpenTelemetry module is imported. With it, spans go
to the tracer provider the application configured (the SDK with the exporter of its choice,
or ``opentelemetry-instrument`` reading the ``OTEL_*`` environment variables); with none
configured, the API's spans record nothing and cost next to nothing.

What travels with a task is a W3C ``traceparent`` (https://www.w3.org/TR/trace-context/):
the submitter's, stored at submit; and the span of each cycle's attempt, carried by the
cycle's first write, so that the next attempt links to it (the one a crash lost included).
Spans hold ids, names and outcomes, never a task's input or output.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError:  # the extra is not installed: tracing is off
    otel_context = propagate = trace = None  # type: ignore[assignment]

#: The instrumentation scope of every span.
TRACER_NAME = "runifold"
#: A W3C traceparent: version, trace id, parent (span) id, flags.
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
#: The attribute prefix of runifold's own attributes.
PREFIX = "runifold."
#: The tracer of every span (a proxy until the application sets a provider, then its).
_TRACER: Any = trace.get_tracer(TRACER_NAME) if trace is not None else None

Attributes = Mapping[str, str | int | float | bool]

#: Seconds between two looks for a tracer provider while none is configured: the API's
#: lookup reads the environment each time (4 % of a busy worker's CPU, two spans a cycle).
#: Once one is configured it stays (the API sets it once), and is not looked up again.
PROVIDER_RECHECK = 1.0
_provider_found = False
_provider_checked_at = float("-inf")


def current_traceparent() -> str | None:
    """The W3C traceparent of the caller's current span, to store with a task it submits.

    Returns:
        ``00-<trace id>-<span id>-<flags>``, or None without the extra or outside a span.
    """
    if propagate is None:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    value = carrier.get("traceparent")
    return value if value and _TRACEPARENT.match(value) else None


@contextlib.contextmanager
def environment_context() -> Iterator[None]:
    """Run the block in the trace of the ``TRACEPARENT`` environment variable, if set.

    OpenTelemetry's environment carrier: a CLI command run by a traced job (a CI step, a
    shell script under an instrumented parent) submits its tasks into that job's trace.
    """
    value = os.environ.get("TRACEPARENT", "").strip()
    if propagate is None or otel_context is None or not _TRACEPARENT.match(value):
        yield
        return
    carrier = {"traceparent": value, "tracestate": os.environ.get("TRACESTATE", "")}
    token = otel_context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        otel_context.detach(token)


class Span:
    """One span of runifold's, or a stand-in that does nothing (tracing off).

    Attributes are named ``runifold.<name>`` (``set("step.kind", "effect")``).
    """

    __slots__ = ("_span",)

    def __init__(self, span: Any = None) -> None:
        self._span = span

    @property
    def recording(self) -> bool:
        """Whether the span is recorded (a tracer provider with a processor is configured)."""
        return self._span is not None and bool(self._span.is_recording())

    def set(self, name: str, value: str | int | float | bool | None) -> None:
        """Set attribute ``runifold.<name>`` (None: left unset)."""
        if self._span is not None and value is not None:
            self._span.set_attribute(PREFIX + name, value)

    def outcome(self, outcome: str, error: str | None = None) -> None:
        """Record what the span's work came to; ``error`` (a message) marks it failed."""
        if self._span is None:
            return
        self._span.set_attribute(PREFIX + "outcome", outcome)
        if error is not None and trace is not None:
            self._span.set_status(trace.Status(trace.StatusCode.ERROR, error))

    def traceparent(self) -> str | None:
        """This span's W3C traceparent (what a later attempt links to)."""
        if self._span is None:
            return None
        context = self._span.get_span_context()
        if not context.is_valid:
            return None
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def current() -> Span:
    """The current span, to add attributes to (a step kind adds its own to its step's).

    A stand-in when no tracer provider is configured: no span is recorded then, and its
    attributes would go nowhere.
    """
    if trace is None or not _provider_configured():
        return _NO_SPAN
    return Span(trace.get_current_span())


#: The stand-in span (records nothing), shared.
_NO_SPAN = Span()
#: What `span` gives when nothing would be recorded or carried: one shared context manager,
#: so that an untraced step makes no generator and no context manager of its own (issue 22).
_UNTRACED: contextlib.nullcontext[Span] = contextlib.nullcontext(_NO_SPAN)


def span(
    name: str,
    attributes: Callable[[], Attributes],
    *,
    parent: str | None = None,
    links: Sequence[tuple[str, Attributes]] = (),
    consumer: bool = False,
) -> contextlib.AbstractContextManager[Span]:
    """Run the block inside a new span, current for the block (handlers nest under it).

    Args:
        name: the span's name (``"step charge"``).
        attributes: gives the ``runifold.`` attribute names (without the prefix) and values;
            called only when a tracer provider is configured (spans may be recorded).
        parent: a W3C traceparent to start the span under (a task's submitter); None: under
            the current span, if any.
        links: (traceparent, attributes) of spans this one follows from (earlier attempts).
        consumer: the span processes queued work (a cycle): span kind CONSUMER.

    Returns:
        A context manager giving the span: a stand-in doing nothing when the extra is not
        installed, or when no provider is configured and there is no trace to carry. An
        exception leaving the block is recorded on the span and marks it failed.
    """
    if trace is None or propagate is None:
        return _UNTRACED
    # No provider configured: nothing is recorded. Inside a trace, a non-recording span
    # still carries its context (a child workflow started here stays in the trace); outside
    # one there is nothing to carry.
    unconfigured = not _provider_configured()
    if unconfigured and parent is None and not trace.get_current_span().get_span_context().is_valid:
        return _UNTRACED
    return _span(name, attributes, parent, links, consumer, unconfigured)


@contextlib.contextmanager
def _span(
    name: str,
    attributes: Callable[[], Attributes],
    parent: str | None,
    links: Sequence[tuple[str, Attributes]],
    consumer: bool,
    unconfigured: bool,
) -> Iterator[Span]:
    """The span of `span` when one is recorded or carries a trace's context."""
    assert trace is not None and propagate is not None
    context = propagate.extract({"traceparent": parent}) if parent else None
    if unconfigured:
        with _TRACER.start_as_current_span(name, context=context) as otel_span:
            yield Span(otel_span)
        return
    span_links = [
        trace.Link(_span_context(link), {PREFIX + k: v for k, v in link_attributes.items()})
        for link, link_attributes in links
        if _TRACEPARENT.match(link)
    ]
    with _TRACER.start_as_current_span(
        name,
        context=context,
        kind=trace.SpanKind.CONSUMER if consumer else trace.SpanKind.INTERNAL,
        attributes={PREFIX + k: v for k, v in attributes().items()},
        links=span_links,
    ) as otel_span:
        yield Span(otel_span)


def _provider_configured() -> bool:
    """Whether the application configured a tracer provider (see `PROVIDER_RECHECK`)."""
    global _provider_found, _provider_checked_at
    if _provider_found:
        return True
    now = time.monotonic()
    if now - _provider_checked_at < PROVIDER_RECHECK:
        return False
    _provider_checked_at = now
    assert trace is not None
    _provider_found = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return _provider_found


def _span_context(traceparent: str) -> Any:
    assert trace is not None
    _, trace_id, span_id, flags = traceparent.split("-")
    flags_value = trace.TraceFlags(int(flags, 16))
    return trace.SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=flags_value
    )
