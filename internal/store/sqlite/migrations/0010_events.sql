-- Sandboxes' lifecycle events. seq is the cursor: AUTOINCREMENT never
-- reuses a value, even once the newest rows are deleted. sandbox_id and
-- team_id have no foreign keys: events outlive the sandbox record, and
-- go only by age.
CREATE TABLE events (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	time_us    INTEGER NOT NULL,
	type       TEXT NOT NULL,
	team_id    TEXT NOT NULL,
	sandbox_id TEXT NOT NULL,
	state      TEXT NOT NULL,  -- '' for none
	prev       TEXT NOT NULL,  -- '' for none
	actor      TEXT NOT NULL,
	request_id TEXT NOT NULL,
	reason     TEXT NOT NULL,
	data       BLOB            -- a JSON object, or NULL
) STRICT;
CREATE INDEX events_team ON events (team_id, seq);
CREATE INDEX events_sandbox ON events (sandbox_id, seq);
-- For the retention delete, which spans every team.
CREATE INDEX events_time ON events (time_us);
