-- A worker's registration has an incarnation: a random id each process draws when it
-- registers. Heartbeats and the stop are keyed by it, so a process that stalled past its
-- registration while another took its worker id over finds out at its next heartbeat (no
-- row) and stops, instead of both heartbeating one row (DESIGN §5). Rows of earlier releases
-- have none: their processes register again on their next start.
ALTER TABLE toolkit_workers ADD COLUMN incarnation text;
