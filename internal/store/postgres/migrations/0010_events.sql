-- Sandboxes' lifecycle events. seq is the cursor; every transaction that
-- inserts an event takes one advisory lock first (see eventLock), so
-- events commit in seq order. sandbox_id and team_id have no foreign
-- keys: events outlive the sandbox record, and go only by age.
CREATE TABLE events (
	seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	time       timestamptz NOT NULL,
	type       text NOT NULL,
	team_id    text NOT NULL,
	sandbox_id text NOT NULL,
	state      text NOT NULL,  -- '' for none
	prev       text NOT NULL,  -- '' for none
	actor      text NOT NULL,
	request_id text NOT NULL,
	reason     text NOT NULL,
	data       bytea           -- a JSON object kept byte for byte, or NULL
);
CREATE INDEX events_team ON events (team_id, seq);
CREATE INDEX events_sandbox ON events (sandbox_id, seq);
-- For the retention delete, which spans every team.
CREATE INDEX events_time ON events (time);
