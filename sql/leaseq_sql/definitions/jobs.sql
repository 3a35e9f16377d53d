-- leaseq's present tense: the jobs table's own rules.
--
-- Covers: leaseq.jobs_check_written (and its trigger), leaseq.retry_delay,
-- leaseq.lease_epoch, leaseq.lease_token_next.
-- Set off by: job_enqueue and every statement that writes queue, job_type or timeout (the
-- check); lease_fail and lease_release in lease.sql and job_reap in queries/jobs.sql
-- (retry_delay); the claims in claims.sql (lease_token_next); server_identity in
-- queries/workers.sql (lease_epoch).
--
-- Migrations are the upgrade path and are written from these files; tests/integration/
-- test_definitions.py proves that the replay of every migration defines exactly what they do.

-- The checks of the columns only the enqueue writes (queue name, job type, timeout), raised
-- as the CHECK constraints they replace would (SQLSTATE 23514, the same constraint names),
-- and only by a statement that sets them. A new job also gets the API's checks, in the API's
-- words (leaseq.InvalidJob, SQLSTATE 22023, the field in COLUMN), whichever way it came in
-- (Queue.enqueue, leaseq.enqueue() or a producer's own INSERT): a payload of at most
-- 1,048,576 bytes as JSON, at most 1,000 attempts, a start time within 3,650 days of now
-- (finite: every reader of every tenant computes ages from it), a timeout of at most 3,650
-- days, keys of 1-512 characters, and a trace context (the W3C traceparent and tracestate
-- headers the enqueue's span wrote, leaseq.core.tracing) that is a JSON object of at most 1,024
-- bytes: the headers' own limits (55 and 512 characters) with room for their names, so a
-- producer cannot park a payload in it. The payload is measured as text, as readers get it: its
-- stored size says little (a number such as 1e100000 is a few bytes stored, 100,001 printed).
CREATE OR REPLACE FUNCTION leaseq.jobs_check_written()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    field text;
    problem text;
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
    IF TG_OP = 'INSERT' THEN
        IF octet_length(NEW.payload::text) > 1048576 THEN
            field := 'payload'; problem := format('is %s bytes as JSON; the limit is 1048576', octet_length(NEW.payload::text));
        ELSIF NEW.max_attempts > 1000 THEN
            field := 'max_attempts'; problem := format('must be at most 1000, got %s', NEW.max_attempts);
        ELSIF NOT isfinite(NEW.available_at)
              OR NEW.available_at NOT BETWEEN now() - interval '3650 days' AND now() + interval '3650 days' THEN
            field := 'run_at'; problem := format('must be a finite time within 3650 days of now, got %s', NEW.available_at);
        ELSIF NEW.timeout > interval '3650 days' THEN
            field := 'timeout'; problem := format('must be at most 315360000 seconds (3650 days), got %s', extract(epoch FROM NEW.timeout));
        ELSIF NEW.idempotency_key = '' OR NEW.dedup_key = '' THEN
            field := CASE WHEN NEW.idempotency_key = '' THEN 'idempotency_key' ELSE 'dedup_key' END;
            problem := 'must be a non-empty string or None';
        ELSIF length(NEW.idempotency_key) > 512 OR length(NEW.dedup_key) > 512 THEN
            field := CASE WHEN length(NEW.idempotency_key) > 512 THEN 'idempotency_key' ELSE 'dedup_key' END;
            problem := format('is %s characters long; the limit is 512', greatest(length(NEW.idempotency_key), length(NEW.dedup_key)));
        ELSIF jsonb_typeof(NEW.trace_context) <> 'object' THEN
            field := 'trace_context'; problem := format('must be a JSON object of W3C trace headers, got a JSON %s', jsonb_typeof(NEW.trace_context));
        ELSIF octet_length(NEW.trace_context::text) > 1024 THEN
            field := 'trace_context'; problem := format('is %s bytes as JSON; the limit is 1024', octet_length(NEW.trace_context::text));
        END IF;
        IF field IS NOT NULL THEN
            RAISE EXCEPTION 'invalid %: %; nothing was written', field, problem
                USING ERRCODE = 'invalid_parameter_value', COLUMN = field, DETAIL = problem;
        END IF;
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

-- This server's failover epoch: (timeline - 1) << 32, its timeline read from the name of the
-- WAL file being written, which pg_ctl promote raises at once (pg_control_checkpoint() lags
-- until the promotion's checkpoint). NULL on a standby, which writes no WAL of its own.
-- Timeline 1, a cluster never failed over, is epoch 0. STABLE: a server's timeline cannot
-- change while a statement runs. A worker compares it on every new connection (with the
-- cluster's system identifier: the server_identity statement) to learn that it reconnected
-- to another primary.
CREATE OR REPLACE FUNCTION leaseq.lease_epoch()
RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN NOT pg_catalog.pg_is_in_recovery()
                THEN (('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) << 32
           END
$$;

-- The token a claim gives a job whose token is `token` on a server whose failover epoch is
-- `epoch` (leaseq.lease_epoch()): one more, and never less than the epoch. A promoted standby
-- writes on a new timeline, so the first claim of a job after a failover outranks every token
-- the lost timeline could have issued, claims that never reached the standby included
-- (docs/operations/failover.md); a timeline holds 2^32 claims of one job. A claim passes
-- `(SELECT leaseq.lease_epoch())`, which PostgreSQL reads once per statement (an InitPlan),
-- and this function is inlined: reading the epoch for each claimed row cost 5 us a row,
-- several per cent of what a claimed job costs the server. A claim's job and its limit unit
-- get the same token (a statement sees one timeline). On a standby (a NULL epoch) one more:
-- the write is refused as read-only anyway.
CREATE OR REPLACE FUNCTION leaseq.lease_token_next(token bigint, epoch bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE
AS $$
    SELECT greatest(token + 1, epoch)
$$;
