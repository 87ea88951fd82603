-- The audit log: one row per mutating API call or refused
-- authentication, each chained to the one before by its hash
-- (store.AuditHash). audit_chain's one row is the chain's head (the last
-- entry appended; every append locks it FOR UPDATE and moves it, so the
-- replicas' appends serialize) and its anchor (the last entry pruned,
-- where verification starts).
CREATE TABLE audit_log (
	seq        bigint PRIMARY KEY,       -- 1, 2, … without gaps, but for pruned ones
	time       timestamptz NOT NULL,
	request_id text NOT NULL,
	key_id     text NOT NULL,            -- '' if unauthenticated
	team_id    text NOT NULL,            -- '' if unauthenticated; no foreign key: entries outlive teams
	source     text NOT NULL,
	method     text NOT NULL,
	route      text NOT NULL,
	targets    text NOT NULL,            -- JSON object of strings (text, not jsonb: kept as written)
	code       integer NOT NULL,
	outcome    text NOT NULL,
	prev       bytea NOT NULL,
	hash       bytea NOT NULL
);
CREATE INDEX audit_log_team ON audit_log (team_id, seq);
CREATE INDEX audit_log_time ON audit_log (time);
CREATE TABLE audit_chain (
	id          integer PRIMARY KEY CHECK (id = 1),
	head_seq    bigint NOT NULL,
	head_hash   bytea NOT NULL,
	anchor_seq  bigint NOT NULL,
	anchor_hash bytea NOT NULL,
	anchor_time timestamptz              -- NULL until something is pruned
);
INSERT INTO audit_chain (id, head_seq, head_hash, anchor_seq, anchor_hash) VALUES (1, 0, '\x', 0, '\x');
