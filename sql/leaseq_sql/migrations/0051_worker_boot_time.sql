-- leaseq schema: a worker registers when its process started, by its host's clock.
-- On Kubernetes the kubelet reports when a container terminated (containerStatuses[].state
-- or lastState .terminated.finishedAt), by the same node's clock. A worker whose process
-- started before that moment in the container's pod ran in the terminated container: none of
-- it can still run, so the operator ends its leases at once (job_reap with owners) instead
-- of waiting for them to expire. NULL for a worker whose id was given (LEASEQ_WORKER_ID: a
-- restarted container's worker may use it again) and for rows that predate the column: their
-- leases wait for expiry as before.
ALTER TABLE leaseq.workers ADD COLUMN boot_at timestamptz;
