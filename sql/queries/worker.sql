-- Named statements used only by the worker runtime (leaseq worker).

-- name: worker_listen
-- Subscribes this session to enqueue/release/retry wake-ups (the payload of each is the queue name).
LISTEN leaseq_jobs;
