-- Traces (issue 23, docs/tracing.md): the W3C traceparent of the span a task was submitted
-- under (its trace), and of the span of its latest attempt, carried by the first fenced
-- write of each traced cycle, so that the next attempt links to it (after a crash, to the
-- attempt that was lost). Both are null without tracing: nothing else reads them.
ALTER TABLE toolkit_tasks ADD COLUMN trace_parent text, ADD COLUMN trace_attempt text;
