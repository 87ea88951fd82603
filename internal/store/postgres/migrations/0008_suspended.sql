-- A suspended sandbox has its own state, 'suspended' (it was 'stopped'
-- with the snapshot in its handle; the control plane still reads such a
-- record as suspended, so the rows are kept as they are).
ALTER TABLE sandboxes DROP CONSTRAINT sandboxes_state_check;
ALTER TABLE sandboxes ADD CONSTRAINT sandboxes_state_check
	CHECK (state IN ('creating', 'running', 'paused', 'stopping', 'stopped', 'suspended', 'failed', 'deleted'));
