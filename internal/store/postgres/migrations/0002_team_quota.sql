-- Teams get an optional quota: opaque JSON kept byte for byte (like
-- sandboxes.spec), or NULL for the server's default.
ALTER TABLE teams ADD COLUMN quota bytea;
