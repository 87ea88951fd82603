-- Coordination: quota columns on sandboxes, leases, worker protocol.
--
-- Sandboxes get what they count against the team's quota as real columns,
-- backfilled from their spec (opaque JSON).
ALTER TABLE sandboxes ADD COLUMN vcpus INTEGER NOT NULL DEFAULT 0 CHECK (vcpus >= 0);
ALTER TABLE sandboxes ADD COLUMN memory_mib INTEGER NOT NULL DEFAULT 0 CHECK (memory_mib >= 0);
-- spec is a BLOB; the cast makes the json functions read it as JSON text.
UPDATE sandboxes SET
	vcpus = CASE WHEN json_type(CAST(spec AS TEXT), '$.vcpus') IN ('integer', 'real')
		THEN max(CAST(json_extract(CAST(spec AS TEXT), '$.vcpus') AS INTEGER), 0) ELSE 0 END,
	memory_mib = CASE WHEN json_type(CAST(spec AS TEXT), '$.memory_mib') IN ('integer', 'real')
		THEN max(CAST(json_extract(CAST(spec AS TEXT), '$.memory_mib') AS INTEGER), 0) ELSE 0 END
WHERE json_valid(CAST(spec AS TEXT)) AND json_type(CAST(spec AS TEXT)) = 'object';

-- Leases: a holder's claim on a name until expires_us. lease_tokens holds
-- the last token handed out, so a name's next holder always gets a higher
-- one, even after a release deleted the row.
CREATE TABLE lease_tokens (
	id   INTEGER PRIMARY KEY CHECK (id = 1),
	last INTEGER NOT NULL
) STRICT;
INSERT INTO lease_tokens (id, last) VALUES (1, 0);
CREATE TABLE leases (
	name        TEXT PRIMARY KEY,
	holder      TEXT NOT NULL,
	token       INTEGER NOT NULL UNIQUE,
	acquired_us INTEGER NOT NULL,
	expires_us  INTEGER NOT NULL
) STRICT;

-- Workers say which protocol they speak and what they can do.
ALTER TABLE workers ADD COLUMN protocol INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN capabilities BLOB;  -- opaque JSON, or NULL
