-- leaseq schema, version 2: a release that does not come from a worker shutting down (a
-- handler raising Interrupted) counts as an attempt, so it gets an outcome of its own in the
-- audit trail. `released` stays the free hand-back of a draining worker; with both, a job's
-- attempt_count is always its claims minus its `released` rows.
ALTER TYPE leaseq.attempt_outcome ADD VALUE IF NOT EXISTS 'interrupted';
