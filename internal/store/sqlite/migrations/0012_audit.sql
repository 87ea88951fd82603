-- The audit log: one row per mutating API call or refused
-- authentication, each chained to the one before by its hash
-- (store.AuditHash). audit_chain's one row is the chain's head (the last
-- entry appended; every append reads and moves it in its transaction)
-- and its anchor (the last entry pruned, where verification starts).
CREATE TABLE audit_log (
	seq        INTEGER PRIMARY KEY,      -- 1, 2, … without gaps, but for pruned ones
	time_us    INTEGER NOT NULL,
	request_id TEXT NOT NULL,
	key_id     TEXT NOT NULL,            -- '' if unauthenticated
	team_id    TEXT NOT NULL,            -- '' if unauthenticated; no foreign key: entries outlive teams
	source     TEXT NOT NULL,
	method     TEXT NOT NULL,
	route      TEXT NOT NULL,
	targets    TEXT NOT NULL,            -- JSON object of strings
	code       INTEGER NOT NULL,
	outcome    TEXT NOT NULL,
	prev       BLOB NOT NULL,
	hash       BLOB NOT NULL
) STRICT;
CREATE INDEX audit_log_team ON audit_log (team_id, seq);
CREATE INDEX audit_log_time ON audit_log (time_us);
CREATE TABLE audit_chain (
	id          INTEGER PRIMARY KEY CHECK (id = 1),
	head_seq    INTEGER NOT NULL,
	head_hash   BLOB NOT NULL,
	anchor_seq  INTEGER NOT NULL,
	anchor_hash BLOB NOT NULL,
	anchor_us   INTEGER NOT NULL         -- 0 until something is pruned
) STRICT;
INSERT INTO audit_chain (id, head_seq, head_hash, anchor_seq, anchor_hash, anchor_us) VALUES (1, 0, X'', 0, X'', 0);
