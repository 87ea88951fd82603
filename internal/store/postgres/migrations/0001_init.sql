CREATE TABLE teams (
	id      text PRIMARY KEY,
	name    text NOT NULL,
	created timestamptz NOT NULL
);

CREATE TABLE api_keys (
	id      text PRIMARY KEY,
	team_id text NOT NULL REFERENCES teams (id),
	name    text NOT NULL,
	admin   boolean NOT NULL,
	hash    bytea NOT NULL UNIQUE CHECK (length(hash) = 32),
	created timestamptz NOT NULL
);
CREATE INDEX api_keys_team ON api_keys (team_id, created);

CREATE TABLE sandboxes (
	id        text PRIMARY KEY,
	team_id   text NOT NULL REFERENCES teams (id),
	template  text NOT NULL,
	state     text NOT NULL CHECK (state IN ('creating', 'running', 'paused', 'stopping', 'stopped', 'failed', 'deleted')),
	worker_id text NOT NULL,         -- '' before placement
	spec      bytea NOT NULL,        -- opaque JSON, kept byte for byte
	handle    bytea,                 -- opaque JSON or NULL
	labels    jsonb NOT NULL,        -- JSON object
	created   timestamptz NOT NULL,
	updated   timestamptz NOT NULL,
	expires   timestamptz,           -- NULL for no expiry
	version   bigint NOT NULL
);
CREATE INDEX sandboxes_team ON sandboxes (team_id, created);
CREATE INDEX sandboxes_worker ON sandboxes (worker_id) WHERE worker_id <> '';
CREATE INDEX sandboxes_expires ON sandboxes (expires) WHERE expires IS NOT NULL;

CREATE TABLE workers (
	id             text PRIMARY KEY,
	address        text NOT NULL,
	vcpus          integer NOT NULL,
	memory_mib     bigint NOT NULL,
	last_heartbeat timestamptz NOT NULL
);
