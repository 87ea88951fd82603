-- Team secrets, sealed by the control plane under a key kept outside the
-- database: a row alone does not reveal a value.
CREATE TABLE secrets (
	team_id text NOT NULL REFERENCES teams (id),
	name    text NOT NULL,
	sealed  bytea NOT NULL,
	hosts   text[] NOT NULL,
	header  text NOT NULL,  -- '' for none
	format  text NOT NULL,  -- '' for none
	created timestamptz NOT NULL,
	updated timestamptz NOT NULL,
	PRIMARY KEY (team_id, name)
);
