-- Templates and the build cache. template_names counts the versions each
-- (team, name) ever had, so a deleted version's number is never reused; its
-- rows are never deleted. snapshot_id has no foreign key: the snapshot
-- record may be deleted while the reference remains.
CREATE TABLE template_names (
	team_id      TEXT NOT NULL REFERENCES teams (id),
	name         TEXT NOT NULL,
	last_version INTEGER NOT NULL CHECK (last_version >= 1),
	PRIMARY KEY (team_id, name)
) STRICT;

CREATE TABLE templates (
	team_id     TEXT NOT NULL,
	name        TEXT NOT NULL,
	version     INTEGER NOT NULL CHECK (version >= 1),
	state       TEXT NOT NULL CHECK (state IN ('building', 'ready', 'failed', 'deleting')),
	cache_key   TEXT NOT NULL,      -- '' for none
	snapshot_id TEXT NOT NULL,      -- '' until ready
	meta        BLOB,               -- opaque JSON or NULL
	created_us  INTEGER NOT NULL,
	updated_us  INTEGER NOT NULL,
	rev         INTEGER NOT NULL,
	PRIMARY KEY (team_id, name, version),
	FOREIGN KEY (team_id, name) REFERENCES template_names (team_id, name)
) STRICT;
CREATE INDEX templates_unsettled ON templates (created_us) WHERE state IN ('building', 'deleting');
CREATE INDEX templates_snapshot ON templates (team_id, snapshot_id) WHERE snapshot_id <> '';

CREATE TABLE build_cache (
	team_id     TEXT NOT NULL REFERENCES teams (id),
	cache_key   TEXT NOT NULL,
	snapshot_id TEXT NOT NULL,
	created_us  INTEGER NOT NULL,
	PRIMARY KEY (team_id, cache_key)
) STRICT;
CREATE INDEX build_cache_team ON build_cache (team_id, created_us);
CREATE INDEX build_cache_snapshot ON build_cache (team_id, snapshot_id);
