-- Streams from handlers (issue 23, docs/progress.md): what `ctx.publish` writes, durably, in
-- its own small fenced write while the step runs. Items are numbered per task (seq, from the
-- task's stream_seq, raised under the lease), so readers resume after the last they saw; a
-- stale worker's publish is refused by the fence, so a reader never sees two attempts'
-- items interleaved. Deleted with their task (retention).
ALTER TABLE toolkit_tasks ADD COLUMN stream_seq integer NOT NULL DEFAULT 0;

CREATE TABLE toolkit_task_stream (
    task_id       bigint      NOT NULL REFERENCES toolkit_tasks (id) ON DELETE CASCADE,
    seq           integer     NOT NULL,
    occurrence    text        NOT NULL,
    fencing_token bigint      NOT NULL,
    value         jsonb       NOT NULL,
    published_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (task_id, seq)
);
