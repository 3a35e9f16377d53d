-- leaseq schema: an update of leaseq.jobs (a claim, a completion, a heartbeat) no longer
-- rebuilds the checks of columns it does not write, and reads smaller trigger conditions.
--
-- PostgreSQL reads every CHECK constraint of a table from its stored node tree, simplifies
-- and compiles it again in every statement that updates the table, whichever columns the
-- statement sets, and does the same for the WHEN clause of every trigger the statement can
-- fire (migration 20 counted it). Counted with an instruction-counting profiler (one
-- backend, claim and completion of one keyless job at a time, PostgreSQL 18.6), after
-- migration 24: 2,171,000 instructions per job, of which the checks of the queue's name,
-- the job type's name, the attempts and the timeout took 283,000, the three checks of the
-- job's state 182,000, and the six WHEN clauses of the status triggers 442,000 (none of
-- them fires for a keyless job).
--
-- * The queue's name, the job type's name and the timeout are written by the enqueue only:
--   they are checked there, and by any update that sets them, by a BEFORE trigger that
--   raises the same error (SQLSTATE 23514, check_violation) naming the same constraint. A
--   column trigger costs an update that does not name its columns nothing. (Domains, as
--   migration 20 gave the key columns, would need the two views over the table rebuilt.)
--   jobs_attempts stays a CHECK: a release gives its attempt back (attempt_count - 1), and
--   the check is what would catch a release applied twice.
-- * "Finished" is status > 'running': leaseq.job_status sorts waiting, pending, running,
--   succeeded, dead, cancelled, so the three final statuses are the ones after running. A
--   status added to the type later must keep that (ALTER TYPE ... ADD VALUE ... BEFORE
--   'succeeded' for an unfinished one). One constant where there was an array of three.
-- * The conditions of four status triggers test columns for NULL where they compared
--   statuses: a job is running exactly when it has a lease (jobs_lease_only_while_running
--   and jobs_running_leased), and finished exactly when finished_at is set. Where that
--   says less than the status did, the trigger's function tests the rest first.
--
-- Counted the same way after this migration: 1,785,000 instructions per keyless job.
CREATE FUNCTION leaseq.jobs_check_written()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF NEW.queue !~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$' THEN
        RAISE EXCEPTION 'new row for relation "jobs" violates check constraint "jobs_queue_name"'
              USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_queue_name',
                    SCHEMA = 'leaseq', TABLE = 'jobs', COLUMN = 'queue';
    END IF;
    IF length(NEW.job_type) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'new row for relation "jobs" violates check constraint "jobs_job_type_name"'
              USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_job_type_name',
                    SCHEMA = 'leaseq', TABLE = 'jobs', COLUMN = 'job_type';
    END IF;
    IF NEW.timeout <= interval '0' THEN
        RAISE EXCEPTION 'new row for relation "jobs" violates check constraint "jobs_timeout_positive"'
              USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_timeout_positive',
                    SCHEMA = 'leaseq', TABLE = 'jobs', COLUMN = 'timeout';
    END IF;
    RETURN NEW;
END
$fn$;

-- Before every other BEFORE trigger (they fire by name): nothing is derived from a bad row.
CREATE TRIGGER jobs_check_written BEFORE INSERT OR UPDATE OF queue, job_type, timeout ON leaseq.jobs
    FOR EACH ROW EXECUTE FUNCTION leaseq.jobs_check_written();

ALTER TABLE leaseq.jobs
    DROP CONSTRAINT jobs_queue_name,
    DROP CONSTRAINT jobs_job_type_name,
    DROP CONSTRAINT jobs_timeout_positive,
    DROP CONSTRAINT jobs_finished_at,
    ADD CONSTRAINT jobs_finished_at CHECK ((status > 'running') = (finished_at IS NOT NULL)) NOT VALID;
-- Its scan takes no lock that blocks workers; the rows passed the same check before.
ALTER TABLE leaseq.jobs VALIDATE CONSTRAINT jobs_finished_at;

-- As in migration 18, first testing what the trigger's condition no longer says: an update
-- that leaves a keyed job pending after it was finished or waiting for its parents.
CREATE OR REPLACE FUNCTION leaseq.flow_on_enqueue()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    floor_vtime double precision;
    inserted boolean;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NOT (NEW.status = 'pending' AND (OLD.finished_at IS NOT NULL OR OLD.status = 'waiting')) THEN
            RETURN NULL;
        END IF;
    END IF;
    SELECT min(f.vtime) INTO floor_vtime FROM leaseq.flow_keys f
     WHERE f.queue = NEW.queue AND f.active;
    INSERT INTO leaseq.flow_keys AS f (queue, key, vtime, active)
    VALUES (NEW.queue, NEW.key, coalesce(floor_vtime, 0), true)
    ON CONFLICT (queue, key) DO UPDATE
       SET active = true, vtime = greatest(f.vtime, coalesce(floor_vtime, f.vtime))
     WHERE NOT f.active
    RETURNING (f.xmax = 0) INTO inserted;
    IF inserted THEN
        PERFORM leaseq.flow_apply(NEW.queue, NEW.key);
    END IF;
    RETURN NULL;
END
$fn$;

-- As in migration 15, first testing what the trigger's condition no longer says: the head
-- was not waiting for its parents.
CREATE OR REPLACE FUNCTION leaseq.flow_on_head_done()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF OLD.status = 'waiting' THEN
        RETURN NULL;
    END IF;
    IF NEW.status = 'dead' THEN
        UPDATE leaseq.flow_aggregates a SET blocked_by = NEW.id, blocked_at = now()
         WHERE a.queue = NEW.queue AND a.ordering_key = NEW.ordering_key;
        RETURN NULL;
    END IF;
    PERFORM leaseq.flow_promote(NEW.queue, NEW.ordering_key);
    RETURN NULL;
END
$fn$;

-- As in migration 15, first testing what the trigger's condition no longer says: a dead
-- head retried (dead to pending).
CREATE OR REPLACE FUNCTION leaseq.flow_on_head_revived()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF OLD.status <> 'dead' OR NEW.status <> 'pending' THEN
        RETURN NULL;
    END IF;
    UPDATE leaseq.flow_aggregates a SET blocked_by = NULL, blocked_at = NULL
     WHERE a.queue = NEW.queue AND a.ordering_key = NEW.ordering_key AND a.blocked_by = NEW.id;
    RETURN NULL;
END
$fn$;

DROP TRIGGER jobs_flow_release ON leaseq.jobs;
DROP TRIGGER jobs_flow_head_done ON leaseq.jobs;
DROP TRIGGER jobs_flow_head_revived ON leaseq.jobs;
DROP TRIGGER jobs_flow_reactivate ON leaseq.jobs;
-- Leaves running.
CREATE TRIGGER jobs_flow_release AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW WHEN (OLD.key IS NOT NULL AND OLD.lease_expires_at IS NOT NULL
                       AND NEW.lease_expires_at IS NULL)
    EXECUTE FUNCTION leaseq.flow_on_leave_running();
-- Finishes (its function: unless it was waiting).
CREATE TRIGGER jobs_flow_head_done AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW WHEN (OLD.ordering_key IS NOT NULL AND NOT OLD.ordering_waiting
                       AND OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL)
    EXECUTE FUNCTION leaseq.flow_on_head_done();
-- Comes back from a final status (its function: from dead, to pending).
CREATE TRIGGER jobs_flow_head_revived AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW WHEN (OLD.ordering_key IS NOT NULL AND OLD.finished_at IS NOT NULL
                       AND NEW.finished_at IS NULL)
    EXECUTE FUNCTION leaseq.flow_on_head_revived();
-- Neither was nor is running (its function: pending now, finished or waiting before).
CREATE TRIGGER jobs_flow_reactivate AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW WHEN (NEW.key IS NOT NULL AND OLD.lease_expires_at IS NULL
                       AND NEW.lease_expires_at IS NULL)
    EXECUTE FUNCTION leaseq.flow_on_enqueue();
