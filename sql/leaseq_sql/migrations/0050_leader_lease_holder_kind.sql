-- leaseq schema: the leader lease says what holds it, and workers yield to an operator.
-- A worker started with `--lead true` (the CLI default) where an operator runs took the
-- leader lease whenever it was free, e.g. while an operator pod restarted, and kept it: the
-- operator's replicas then never led, so none resumed or scaled a WorkerPool's Deployment,
-- and nothing said why. leader_leases.holder_kind records what holds the lease (operator,
-- reaper or worker); leader_acquire refuses a worker a lease whose last holder was an
-- operator or a `leaseq reaper`; leader_release keeps every row (lapsed) instead of
-- deleting it, so the database remembers that an operator has led (and terms only grow). Existing rows count as
-- a worker's until their holder renews them (every pass).
ALTER TABLE leaseq.leader_leases
    ADD COLUMN holder_kind text NOT NULL DEFAULT 'worker'
        CONSTRAINT leader_leases_holder_kind_check CHECK (holder_kind IN ('operator', 'reaper', 'worker'));
