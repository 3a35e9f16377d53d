-- Named statements used only by the worker runtime (leaseq worker).

-- name: worker_listen
-- Subscribes this session to enqueue/release/retry wake-ups (the payload of each is the queue name).
LISTEN leaseq_jobs;

-- name: worker_session
-- Makes this session reuse one generic plan per prepared statement: every worker statement is a by-id or by-index statement whose generic plan is its custom plan, so planning each call would be wasted (the claim's planning cost as much as its execution). JIT off: a generic plan cannot see LIMIT, so with many flow keys the keyed claim's estimate passes jit_above_cost and every call compiled (~50 ms, against 1 ms to run).
SET plan_cache_mode = force_generic_plan; SET jit = off;

-- name: server_identity
-- The server a new connection reached: its cluster's system identifier and failover epoch (leaseq.lease_epoch; NULL on a standby). A promotion changes the epoch, a different cluster the identifier.
SELECT s.system_identifier::text AS system_identifier, leaseq.lease_epoch() AS epoch
  FROM pg_catalog.pg_control_system() s;
