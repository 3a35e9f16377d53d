-- leaseq schema, version 5: workers report the job types they serve (they claim only those),
-- so ready work that no live worker can run is visible and is not counted as a pool's work.

-- The job types this worker's registry serves; NULL for a worker that predates the column
-- (it claims every type of its queues).
ALTER TABLE leaseq.workers ADD COLUMN job_types text[];
