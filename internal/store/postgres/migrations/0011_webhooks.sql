-- Webhooks: a team's subscriptions to its lifecycle events (package
-- webhook delivers them), and the log of their delivery attempts, pruned
-- to the last store.WebhookDeliveriesKept per webhook.
CREATE TABLE webhooks (
	id              text PRIMARY KEY,
	team_id         text NOT NULL REFERENCES teams (id),
	url             text NOT NULL,
	types           text[] NOT NULL,  -- empty = every type
	description     text NOT NULL,
	secret          text NOT NULL,
	format          text NOT NULL,    -- '' for SPACE's deliveries, 'e2b' for E2B's
	enabled         boolean NOT NULL,
	disabled_reason text NOT NULL,    -- '' unless the dispatcher disabled it
	event_cursor    bigint NOT NULL CHECK (event_cursor >= 0), -- the last event delivered
	failures        integer NOT NULL CHECK (failures >= 0),
	created         timestamptz NOT NULL,
	updated         timestamptz NOT NULL
);
CREATE INDEX webhooks_team ON webhooks (team_id, created);
CREATE TABLE webhook_deliveries (
	id          bigserial PRIMARY KEY,
	webhook_id  text NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
	event_seq   bigint NOT NULL,      -- 0 for a ping
	event_type  text NOT NULL,
	attempt     integer NOT NULL,
	time        timestamptz NOT NULL,
	status_code integer NOT NULL,     -- 0 if no response came
	error       text NOT NULL,
	duration_ms bigint NOT NULL,
	delivered   boolean NOT NULL
);
CREATE INDEX webhook_deliveries_hook ON webhook_deliveries (webhook_id, id);
