-- Team secrets, sealed by the control plane under a key kept outside the
-- database: a row alone does not reveal a value.
CREATE TABLE secrets (
	team_id    TEXT NOT NULL REFERENCES teams (id),
	name       TEXT NOT NULL,
	sealed     BLOB NOT NULL,
	hosts      TEXT NOT NULL, -- JSON array of host names
	header     TEXT NOT NULL, -- '' for none
	format     TEXT NOT NULL, -- '' for none
	created_us INTEGER NOT NULL,
	updated_us INTEGER NOT NULL,
	PRIMARY KEY (team_id, name)
) STRICT;
