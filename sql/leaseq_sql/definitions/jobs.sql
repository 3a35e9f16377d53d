-- leaseq's present tense: the jobs table's own rules.
--
-- Covers: leaseq.jobs_check_written (and its trigger), leaseq.retry_delay.
-- Set off by: job_enqueue and every statement that writes queue, job_type or timeout (the
-- check); job_fail and job_reap in queries/jobs.sql (retry_delay).
--
-- Migrations are the upgrade path and are written from these files; tests/integration/
-- test_definitions.py proves that the replay of every migration defines exactly what they do.

-- The checks of the columns only the enqueue writes (queue name, job type, timeout), raised
-- as the CHECK constraints they replace would (SQLSTATE 23514, the same constraint names),
-- and only by a statement that sets them.
CREATE OR REPLACE FUNCTION leaseq.jobs_check_written()
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

CREATE OR REPLACE TRIGGER jobs_check_written
    BEFORE INSERT OR UPDATE OF queue, job_type, timeout ON leaseq.jobs
    FOR EACH ROW EXECUTE FUNCTION leaseq.jobs_check_written();

-- Backoff before retry number `attempt` + 1: capped exponential with equal jitter, computed
-- in the database so fail() and the reaper share one formula and one clock.
CREATE OR REPLACE FUNCTION leaseq.retry_delay(attempt integer, base_seconds double precision,
                                   cap_seconds double precision)
RETURNS interval
LANGUAGE sql VOLATILE
AS $$
    SELECT make_interval(secs => d / 2 + random() * d / 2)
      FROM (SELECT least(cap_seconds, base_seconds * power(2, greatest(attempt, 1) - 1)) AS d) s
$$;
