-- Webhooks: a team's subscriptions to its lifecycle events (package
-- webhook delivers them), and the log of their delivery attempts, pruned
-- to the last store.WebhookDeliveriesKept per webhook.
CREATE TABLE webhooks (
	id              TEXT PRIMARY KEY,
	team_id         TEXT NOT NULL REFERENCES teams (id),
	url             TEXT NOT NULL,
	types           TEXT NOT NULL,    -- JSON list; [] = every type
	description     TEXT NOT NULL,
	secret          TEXT NOT NULL,
	format          TEXT NOT NULL,    -- '' for SPACE's deliveries, 'e2b' for E2B's
	enabled         INTEGER NOT NULL CHECK (enabled IN (0, 1)),
	disabled_reason TEXT NOT NULL,    -- '' unless the dispatcher disabled it
	event_cursor    INTEGER NOT NULL CHECK (event_cursor >= 0), -- the last event delivered
	failures        INTEGER NOT NULL CHECK (failures >= 0),
	created_us      INTEGER NOT NULL,
	updated_us      INTEGER NOT NULL
) STRICT;
CREATE INDEX webhooks_team ON webhooks (team_id, created_us);
CREATE TABLE webhook_deliveries (
	id          INTEGER PRIMARY KEY AUTOINCREMENT,
	webhook_id  TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
	event_seq   INTEGER NOT NULL,     -- 0 for a ping
	event_type  TEXT NOT NULL,
	attempt     INTEGER NOT NULL,
	time_us     INTEGER NOT NULL,
	status_code INTEGER NOT NULL,     -- 0 if no response came
	error       TEXT NOT NULL,
	duration_ms INTEGER NOT NULL,
	delivered   INTEGER NOT NULL CHECK (delivered IN (0, 1))
) STRICT;
CREATE INDEX webhook_deliveries_hook ON webhook_deliveries (webhook_id, id);
