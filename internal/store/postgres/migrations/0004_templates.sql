-- Templates and the build cache. template_names counts the versions each
-- (team, name) ever had, so a deleted version's number is never reused; its
-- rows are never deleted. snapshot_id has no foreign key: the snapshot
-- record may be deleted while the reference remains.
CREATE TABLE template_names (
	team_id      text NOT NULL REFERENCES teams (id),
	name         text NOT NULL,
	last_version integer NOT NULL CHECK (last_version >= 1),
	PRIMARY KEY (team_id, name)
);

CREATE TABLE templates (
	team_id     text NOT NULL,
	name        text NOT NULL,
	version     integer NOT NULL CHECK (version >= 1),
	state       text NOT NULL CHECK (state IN ('building', 'ready', 'failed', 'deleting')),
	cache_key   text NOT NULL,     -- '' for none
	snapshot_id text NOT NULL,     -- '' until ready
	meta        bytea,             -- opaque JSON kept byte for byte, or NULL
	created     timestamptz NOT NULL,
	updated     timestamptz NOT NULL,
	rev         bigint NOT NULL,
	PRIMARY KEY (team_id, name, version),
	FOREIGN KEY (team_id, name) REFERENCES template_names (team_id, name)
);
CREATE INDEX templates_unsettled ON templates (created) WHERE state IN ('building', 'deleting');
CREATE INDEX templates_snapshot ON templates (team_id, snapshot_id) WHERE snapshot_id <> '';

CREATE TABLE build_cache (
	team_id     text NOT NULL REFERENCES teams (id),
	cache_key   text NOT NULL,
	snapshot_id text NOT NULL,
	created     timestamptz NOT NULL,
	PRIMARY KEY (team_id, cache_key)
);
CREATE INDEX build_cache_team ON build_cache (team_id, created);
CREATE INDEX build_cache_snapshot ON build_cache (team_id, snapshot_id);
