-- Teams get an optional quota: opaque JSON, or NULL for the server's default.
ALTER TABLE teams ADD COLUMN quota BLOB;
