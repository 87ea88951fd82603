-- Snapshots of sandboxes. sandbox_id has no foreign key: the sandbox may be
-- deleted while its snapshots remain.
CREATE TABLE snapshots (
	id            text PRIMARY KEY,
	team_id       text NOT NULL REFERENCES teams (id),
	sandbox_id    text NOT NULL,
	name          text NOT NULL,     -- '' for none
	state         text NOT NULL CHECK (state IN ('creating', 'ready', 'deleting')),
	worker_id     text NOT NULL,     -- '' for none
	manifest      text NOT NULL,     -- '' while creating
	logical_bytes bigint NOT NULL CHECK (logical_bytes >= 0),
	new_bytes     bigint NOT NULL CHECK (new_bytes >= 0),
	meta          bytea,             -- opaque JSON kept byte for byte, or NULL
	created       timestamptz NOT NULL,
	updated       timestamptz NOT NULL,
	version       bigint NOT NULL
);
CREATE INDEX snapshots_team ON snapshots (team_id, created);
CREATE INDEX snapshots_sandbox ON snapshots (team_id, sandbox_id, created);
CREATE UNIQUE INDEX snapshots_name ON snapshots (team_id, name) WHERE name <> '';
