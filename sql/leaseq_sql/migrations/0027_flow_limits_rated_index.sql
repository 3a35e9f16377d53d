-- leaseq schema: whether a queue has a rate set is one index probe.
--
-- The keyed claim of queues with limits but no rates (job_claim_keyed_slots) asks at every
-- call whether one of its queues has a rate set since (then it claims nothing, and the
-- worker claims by job_claim_keyed, which keeps the buckets). A queue may hold a limit row
-- per key, thousands of them without a rate: this index holds the rated ones only.
CREATE INDEX flow_limits_rated_idx ON leaseq.flow_limits (queue) WHERE per_second IS NOT NULL;
