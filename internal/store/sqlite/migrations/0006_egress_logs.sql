-- Sandboxes' egress audit logs, archived when they leave a worker: one row
-- per worker's log of one run of a sandbox. sandbox_id has no foreign key:
-- the segments outlive the sandbox record.
CREATE TABLE egress_logs (
	team_id    TEXT NOT NULL REFERENCES teams (id),
	sandbox_id TEXT NOT NULL,
	log_id     TEXT NOT NULL,
	created_us INTEGER NOT NULL,
	data       BLOB NOT NULL, -- opaque (gzipped JSON lines); may be empty
	PRIMARY KEY (team_id, sandbox_id, log_id)
) STRICT;
-- For the retention delete, which spans every team.
CREATE INDEX egress_logs_created ON egress_logs (created_us);
