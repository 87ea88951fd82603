-- Recovery from a lost worker. A sandbox being restored on another
-- worker from its latest checkpoint is 'recovering'; a worker has a
-- fencing epoch, raised when its sandboxes are taken away from it (see
-- workerproto.LeaseRequest).
ALTER TABLE sandboxes DROP CONSTRAINT sandboxes_state_check;
ALTER TABLE sandboxes ADD CONSTRAINT sandboxes_state_check
	CHECK (state IN ('creating', 'running', 'paused', 'stopping', 'stopped', 'suspended', 'recovering', 'failed', 'deleted'));
ALTER TABLE workers ADD COLUMN epoch bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0);
