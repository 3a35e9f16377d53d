-- A lease exists only while its job runs: every transition out of running already clears
-- lease_expires_at, and this makes it a rule. The fenced statements rely on it: they match a
-- lease by owner, token and an unexpired lease_expires_at without naming the status, so the
-- planner can only find the row by primary key (see sql/leaseq_sql/queries/jobs.sql).
-- Added NOT VALID, then validated: the validation scan takes no lock that blocks workers.
ALTER TABLE leaseq.jobs ADD CONSTRAINT jobs_lease_only_while_running
    CHECK (lease_expires_at IS NULL OR status = 'running') NOT VALID;
ALTER TABLE leaseq.jobs VALIDATE CONSTRAINT jobs_lease_only_while_running;
