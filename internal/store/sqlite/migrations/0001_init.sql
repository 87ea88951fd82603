-- Times are INTEGER microseconds since the Unix epoch, UTC.
CREATE TABLE teams (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL,
	created_us INTEGER NOT NULL
) STRICT;

CREATE TABLE api_keys (
	id         TEXT PRIMARY KEY,
	team_id    TEXT NOT NULL REFERENCES teams (id),
	name       TEXT NOT NULL,
	admin      INTEGER NOT NULL CHECK (admin IN (0, 1)),
	hash       BLOB NOT NULL UNIQUE CHECK (length(hash) = 32),
	created_us INTEGER NOT NULL
) STRICT;
CREATE INDEX api_keys_team ON api_keys (team_id, created_us);

CREATE TABLE sandboxes (
	id         TEXT PRIMARY KEY,
	team_id    TEXT NOT NULL REFERENCES teams (id),
	template   TEXT NOT NULL,
	state      TEXT NOT NULL CHECK (state IN ('creating', 'running', 'paused', 'stopping', 'stopped', 'failed', 'deleted')),
	worker_id  TEXT NOT NULL,            -- '' before placement
	spec       BLOB NOT NULL,            -- opaque JSON
	handle     BLOB,                     -- opaque JSON or NULL
	labels     TEXT NOT NULL,            -- JSON object
	created_us INTEGER NOT NULL,
	updated_us INTEGER NOT NULL,
	expires_us INTEGER,                  -- NULL for no expiry
	version    INTEGER NOT NULL
) STRICT;
CREATE INDEX sandboxes_team ON sandboxes (team_id, created_us);
CREATE INDEX sandboxes_worker ON sandboxes (worker_id) WHERE worker_id <> '';
CREATE INDEX sandboxes_expires ON sandboxes (expires_us) WHERE expires_us IS NOT NULL;

CREATE TABLE workers (
	id                TEXT PRIMARY KEY,
	address           TEXT NOT NULL,
	vcpus             INTEGER NOT NULL,
	memory_mib        INTEGER NOT NULL,
	last_heartbeat_us INTEGER NOT NULL
) STRICT;
