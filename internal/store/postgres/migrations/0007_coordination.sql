-- Coordination between control plane replicas sharing the database.
--
-- Sandboxes get what they count against the team's quota as real columns,
-- backfilled from their spec (opaque JSON, kept byte for byte as bytea).
ALTER TABLE sandboxes ADD COLUMN vcpus integer NOT NULL DEFAULT 0 CHECK (vcpus >= 0);
ALTER TABLE sandboxes ADD COLUMN memory_mib bigint NOT NULL DEFAULT 0 CHECK (memory_mib >= 0);
UPDATE sandboxes SET
	vcpus = CASE WHEN jsonb_typeof(s.j->'vcpus') = 'number' THEN greatest((s.j->>'vcpus')::numeric, 0)::integer ELSE 0 END,
	memory_mib = CASE WHEN jsonb_typeof(s.j->'memory_mib') = 'number' THEN greatest((s.j->>'memory_mib')::numeric, 0)::bigint ELSE 0 END
FROM (SELECT id, convert_from(spec, 'UTF8')::jsonb AS j FROM sandboxes) AS s
WHERE sandboxes.id = s.id AND jsonb_typeof(s.j) = 'object';

-- Leases: a holder's claim on a name until expires (by the database's
-- clock). Tokens come from one sequence, so a name's next holder always
-- gets a higher token, even after a release deleted the row.
CREATE SEQUENCE lease_tokens AS bigint;
CREATE TABLE leases (
	name     text COLLATE "C" PRIMARY KEY,
	holder   text NOT NULL,
	token    bigint NOT NULL UNIQUE,
	acquired timestamptz NOT NULL,
	expires  timestamptz NOT NULL
);

-- Workers say which protocol they speak and what they can do.
ALTER TABLE workers ADD COLUMN protocol integer NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN capabilities bytea;  -- opaque JSON, or NULL
