-- leaseq schema: a statement that updates leaseq.jobs pays less for the expressions of its
-- triggers and constraints.
--
-- PostgreSQL reads a table's CHECK constraints and its triggers' WHEN clauses from their
-- stored node trees again in every statement that updates the table (parsed, simplified
-- and compiled once per statement, whatever the number of rows), so each costs in
-- proportion to its size at every claim, completion and heartbeat, keyless or not. Counted
-- with an instruction-counting profiler (one backend, single-row updates of a 100-job
-- table in a new database, PostgreSQL 18.6): an update that sets no status (a heartbeat)
-- took 725,000 instructions, of which the CHECK constraints about 330,000 and the WHEN
-- clauses about 205,000; an update that sets status 787,000; an insert 531,000.
--
-- * The four flow triggers fire on status changes only, so they are now column triggers
--   (UPDATE OF status, as the notify and pipeline triggers already were): a statement that
--   does not set status never reads their WHEN clauses. Every transition sets status in its
--   UPDATE's SET list, and no BEFORE UPDATE trigger changes it.
-- * "Finished" is written as finished_at IS NOT NULL, not as a list of three statuses: the
--   same by CHECK jobs_finished_at, and a fraction of the size (an array of enum constants
--   is a large node). Unfinished statuses are waiting, pending and running.
-- * A CHECK passes when its expression is NULL, so "x IS NULL OR" in front of a check of x
--   says nothing: dropped from the timeout check (added NOT VALID, then validated: the scan
--   takes no lock that blocks workers).
-- * The key, the ordering key and the count of unmet parents (deps_left) are checked by
--   their types, domains over text and integer: a backend keeps a domain's check once
--   parsed, and runs it only where a value of the type is written (an insert, an update
--   that sets the column), never in a claim, a completion or a heartbeat (deps_left is
--   written by a parent's completion only). The constraints keep their names (an error
--   still names jobs_key_name). They are added NOT VALID and left so: the values already
--   stored passed the same check as a table constraint, and validating a domain's check
--   would lock the table against writes for its scan. The columns' change of type is
--   binary compatible: the table is not rewritten, but the five indexes that name one of
--   the columns (jobs_claim_idx, jobs_key_claim_idx, jobs_key_unfinished_idx,
--   jobs_ordering_idx, jobs_waiting_idx) are rebuilt, with the table locked, as migration
--   18 rebuilt one of them: the hot table holds unfinished and recently finished jobs only.
--
-- Counted the same way after this migration: 421,000 instructions per heartbeat update
-- (-42%), 619,000 per status update (-21%), 431,000 per insert (-19%).

-- Every trigger that names the key or the ordering key goes first: a column's type cannot
-- change under a trigger's WHEN clause.
DROP TRIGGER jobs_flow_release ON leaseq.jobs;
DROP TRIGGER jobs_flow_head_done ON leaseq.jobs;
DROP TRIGGER jobs_flow_head_revived ON leaseq.jobs;
DROP TRIGGER jobs_flow_reactivate ON leaseq.jobs;
DROP TRIGGER jobs_flow_enqueue ON leaseq.jobs;
DROP TRIGGER jobs_flow_enqueue_ordered ON leaseq.jobs;
DROP TRIGGER jobs_notify_done ON leaseq.jobs;

ALTER TABLE leaseq.jobs
    DROP CONSTRAINT jobs_timeout_positive,
    ADD CONSTRAINT jobs_timeout_positive CHECK (timeout > interval '0') NOT VALID;
ALTER TABLE leaseq.jobs VALIDATE CONSTRAINT jobs_timeout_positive;

CREATE DOMAIN leaseq.job_key AS text;
CREATE DOMAIN leaseq.job_ordering_key AS text;
CREATE DOMAIN leaseq.job_deps_left AS integer;
ALTER TABLE leaseq.jobs
    DROP CONSTRAINT jobs_key_name,
    DROP CONSTRAINT jobs_ordering_key_name,
    DROP CONSTRAINT jobs_deps_left,
    ALTER COLUMN key TYPE leaseq.job_key,
    ALTER COLUMN ordering_key TYPE leaseq.job_ordering_key,
    ALTER COLUMN deps_left TYPE leaseq.job_deps_left;
ALTER DOMAIN leaseq.job_key
    ADD CONSTRAINT jobs_key_name CHECK (length(VALUE) BETWEEN 1 AND 200) NOT VALID;
ALTER DOMAIN leaseq.job_ordering_key
    ADD CONSTRAINT jobs_ordering_key_name CHECK (length(VALUE) BETWEEN 1 AND 200) NOT VALID;
ALTER DOMAIN leaseq.job_deps_left
    ADD CONSTRAINT jobs_deps_left CHECK (VALUE >= 0) NOT VALID;

-- As migration 15 made them.
CREATE TRIGGER jobs_flow_enqueue AFTER INSERT ON leaseq.jobs
    FOR EACH ROW WHEN (NEW.key IS NOT NULL) EXECUTE FUNCTION leaseq.flow_on_enqueue();
CREATE TRIGGER jobs_flow_enqueue_ordered BEFORE INSERT ON leaseq.jobs
    FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL) EXECUTE FUNCTION leaseq.flow_on_enqueue_ordered();

CREATE TRIGGER jobs_flow_release AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status <> 'running' AND OLD.key IS NOT NULL)
    EXECUTE FUNCTION leaseq.flow_on_leave_running();
CREATE TRIGGER jobs_flow_head_done AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW WHEN (OLD.ordering_key IS NOT NULL AND NOT OLD.ordering_waiting
                       AND OLD.finished_at IS NULL AND OLD.status <> 'waiting'
                       AND NEW.finished_at IS NOT NULL)
    EXECUTE FUNCTION leaseq.flow_on_head_done();
CREATE TRIGGER jobs_flow_head_revived AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW WHEN (OLD.ordering_key IS NOT NULL AND OLD.status = 'dead' AND NEW.status = 'pending')
    EXECUTE FUNCTION leaseq.flow_on_head_revived();
CREATE TRIGGER jobs_flow_reactivate AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW WHEN (NEW.key IS NOT NULL AND NEW.status = 'pending'
                       AND (OLD.finished_at IS NOT NULL OR OLD.status = 'waiting'))
    EXECUTE FUNCTION leaseq.flow_on_enqueue();
CREATE TRIGGER jobs_notify_done AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW WHEN (NEW.notify_done AND NEW.finished_at IS NOT NULL
                       AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION leaseq.notify_done();
