-- leaseq schema, version 2: what an infrastructure fault must not cost.
--
-- claim_id: each claim call stamps the rows it takes with an id of its own, so a claim whose
-- answer was lost with its connection (the commit happened, the reply did not arrive) can be
-- asked again for exactly those rows, instead of leaving them to expire and cost an attempt.
ALTER TABLE leaseq.jobs ADD COLUMN claim_id uuid;

-- A release that does not come from a worker shutting down (a handler raising Interrupted)
-- counts as an attempt, so it gets an outcome of its own in the audit trail. `released` stays
-- the free hand-back of a draining worker; with both, a job's attempt_count is always its
-- claims minus its `released` rows.
ALTER TYPE leaseq.attempt_outcome ADD VALUE IF NOT EXISTS 'interrupted';
