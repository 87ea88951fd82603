-- Snapshots of sandboxes. sandbox_id has no foreign key: the sandbox may be
-- deleted while its snapshots remain.
CREATE TABLE snapshots (
	id            TEXT PRIMARY KEY,
	team_id       TEXT NOT NULL REFERENCES teams (id),
	sandbox_id    TEXT NOT NULL,
	name          TEXT NOT NULL,        -- '' for none
	state         TEXT NOT NULL CHECK (state IN ('creating', 'ready', 'deleting')),
	worker_id     TEXT NOT NULL,        -- '' for none
	manifest      TEXT NOT NULL,        -- '' while creating
	logical_bytes INTEGER NOT NULL CHECK (logical_bytes >= 0),
	new_bytes     INTEGER NOT NULL CHECK (new_bytes >= 0),
	meta          BLOB,                 -- opaque JSON or NULL
	created_us    INTEGER NOT NULL,
	updated_us    INTEGER NOT NULL,
	version       INTEGER NOT NULL
) STRICT;
CREATE INDEX snapshots_team ON snapshots (team_id, created_us);
CREATE INDEX snapshots_sandbox ON snapshots (team_id, sandbox_id, created_us);
CREATE UNIQUE INDEX snapshots_name ON snapshots (team_id, name) WHERE name <> '';
