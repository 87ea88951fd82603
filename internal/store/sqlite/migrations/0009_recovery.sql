-- Recovery from a lost worker. A sandbox being restored on another
-- worker from its latest checkpoint is 'recovering'; a worker has a
-- fencing epoch, raised when its sandboxes are taken away from it (see
-- workerproto.LeaseRequest). SQLite cannot change a CHECK constraint in
-- place: the sandboxes table is rebuilt as 0008 did, every column copied.
CREATE TABLE sandboxes_new (
	id         TEXT PRIMARY KEY,
	team_id    TEXT NOT NULL REFERENCES teams (id),
	template   TEXT NOT NULL,
	state      TEXT NOT NULL CHECK (state IN ('creating', 'running', 'paused', 'stopping', 'stopped', 'suspended', 'recovering', 'failed', 'deleted')),
	worker_id  TEXT NOT NULL,            -- '' before placement
	spec       BLOB NOT NULL,            -- opaque JSON
	handle     BLOB,                     -- opaque JSON or NULL
	labels     TEXT NOT NULL,            -- JSON object
	created_us INTEGER NOT NULL,
	updated_us INTEGER NOT NULL,
	expires_us INTEGER,                  -- NULL for no expiry
	version    INTEGER NOT NULL,
	vcpus      INTEGER NOT NULL DEFAULT 0 CHECK (vcpus >= 0),
	memory_mib INTEGER NOT NULL DEFAULT 0 CHECK (memory_mib >= 0)
) STRICT;
INSERT INTO sandboxes_new (id, team_id, template, state, worker_id, spec, handle, labels, created_us, updated_us, expires_us, version, vcpus, memory_mib)
	SELECT id, team_id, template, state, worker_id, spec, handle, labels, created_us, updated_us, expires_us, version, vcpus, memory_mib FROM sandboxes;
DROP TABLE sandboxes;
ALTER TABLE sandboxes_new RENAME TO sandboxes;
CREATE INDEX sandboxes_team ON sandboxes (team_id, created_us);
CREATE INDEX sandboxes_worker ON sandboxes (worker_id) WHERE worker_id <> '';
CREATE INDEX sandboxes_expires ON sandboxes (expires_us) WHERE expires_us IS NOT NULL;
ALTER TABLE workers ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0 CHECK (epoch >= 0);
