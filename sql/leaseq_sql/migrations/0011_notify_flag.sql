-- Completions notify only the jobs someone may wait for; every other job pays nothing.
--
-- Until now (migration 7) every job's final transition ran leaseq.notify_done(): a shared
-- advisory lock on its bucket and a primary-key probe of leaseq.job_waiters, whether or not
-- anybody waited. Now the flag is a column of the job, leaseq.jobs.notify_done, and the
-- trigger's WHEN clause reads it: an unwatched job's completion evaluates one boolean in the
-- trigger condition and calls no function.
--
-- - enqueue(wait=True) (the Python faces and leaseq.enqueue(wait => true)) sets the flag in
--   the INSERT itself.
-- - A waiter that arrives later (result() on a job enqueued without wait) sets it with
--   UPDATE ... WHERE status is unfinished, in an autocommit statement, after it LISTENs and
--   before it reads the job. No completion is missed: the UPDATE and a completion lock the
--   same row, so one waits for the other. If the flag commits first, the completion's UPDATE
--   works on the flagged row version and its trigger notifies. If the completion commits
--   first, the flag's WHERE is re-checked against the finished row and updates nothing, and
--   the waiter's read that follows sees the job finished. A claim that meets the row while
--   it is being flagged skips it for that moment (SKIP LOCKED), as it skips any locked row.
-- - The notification stays a wake-up only: the waiter re-reads the row.
--
-- job_waiters, the bucket locks and the finishing-wait they needed are gone.

ALTER TABLE leaseq.jobs ADD COLUMN notify_done boolean NOT NULL DEFAULT false;
ALTER TABLE leaseq.job_history ADD COLUMN notify_done boolean NOT NULL DEFAULT false;

DROP TRIGGER jobs_notify_done ON leaseq.jobs;

CREATE OR REPLACE FUNCTION leaseq.notify_done() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('leaseq_done', NEW.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_done
    AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW
    WHEN (NEW.notify_done AND NEW.status IN ('succeeded', 'dead', 'cancelled')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION leaseq.notify_done();

DROP TABLE leaseq.job_waiters;

-- As in migration 7, but the wait flag is the job's own column.
CREATE OR REPLACE FUNCTION leaseq.enqueue(
    queue text,
    job_type text,
    payload jsonb DEFAULT 'null',
    priority integer DEFAULT 100,
    run_at timestamptz DEFAULT NULL,
    delay double precision DEFAULT 0,
    max_attempts integer DEFAULT 5,
    timeout double precision DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    wait boolean DEFAULT false
) RETURNS TABLE (id bigint, created boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    field text;
    problem text;
    new_id bigint;
BEGIN
    -- The same rules, in the same order, as leaseq.core.validation (JobSpec.validated).
    IF enqueue.queue IS NULL OR enqueue.queue ~ '^\s*$' THEN
        field := 'queue'; problem := 'must not be empty';
    ELSIF length(enqueue.queue) > 128 THEN
        field := 'queue'; problem := format('is %s characters long; the limit is 128', length(enqueue.queue));
    ELSIF enqueue.queue !~ '^[A-Za-z0-9][A-Za-z0-9._:-]*$' THEN
        field := 'queue'; problem := format('%L is not a queue name: 1-128 characters of letters, digits and . _ : -, starting with a letter or digit', enqueue.queue);
    ELSIF enqueue.job_type IS NULL OR enqueue.job_type ~ '^\s*$' THEN
        field := 'job_type'; problem := 'must not be empty';
    ELSIF length(enqueue.job_type) > 128 THEN
        field := 'job_type'; problem := format('is %s characters long; the limit is 128', length(enqueue.job_type));
    ELSIF octet_length(coalesce(enqueue.payload, 'null')::text) > 1048576 THEN
        field := 'payload'; problem := format('is %s bytes as JSON; the limit is 1048576', octet_length(enqueue.payload::text));
    ELSIF enqueue.priority IS NULL OR enqueue.priority NOT BETWEEN -32768 AND 32767 THEN
        field := 'priority'; problem := format('must be an integer in [-32768, 32767], got %s', coalesce(enqueue.priority::text, 'NULL'));
    ELSIF enqueue.delay IS NULL OR enqueue.delay IN ('NaN', 'Infinity', '-Infinity') THEN
        field := 'delay'; problem := format('must be a finite number, got %s', coalesce(enqueue.delay::text, 'NULL'));
    ELSIF enqueue.delay < 0 THEN
        field := 'delay'; problem := format('must not be negative, got %s', enqueue.delay);
    ELSIF enqueue.max_attempts IS NULL OR enqueue.max_attempts < 1 THEN
        field := 'max_attempts'; problem := format('must be at least 1, got %s', coalesce(enqueue.max_attempts::text, 'NULL'));
    ELSIF enqueue.timeout IN ('NaN', 'Infinity', '-Infinity') THEN
        field := 'timeout'; problem := format('must be a finite number, got %s', enqueue.timeout);
    ELSIF enqueue.timeout < 0 THEN
        field := 'timeout'; problem := format('must not be negative, got %s', enqueue.timeout);
    ELSIF enqueue.timeout = 0 THEN
        field := 'timeout'; problem := 'must be greater than zero';
    ELSIF enqueue.idempotency_key = '' THEN
        field := 'idempotency_key'; problem := 'must be a non-empty string or None';
    ELSIF length(enqueue.idempotency_key) > 512 THEN
        field := 'idempotency_key'; problem := format('is %s characters long; the limit is 512', length(enqueue.idempotency_key));
    ELSIF enqueue.dedup_key = '' THEN
        field := 'dedup_key'; problem := 'must be a non-empty string or None';
    ELSIF length(enqueue.dedup_key) > 512 THEN
        field := 'dedup_key'; problem := format('is %s characters long; the limit is 512', length(enqueue.dedup_key));
    END IF;
    IF field IS NOT NULL THEN
        -- Worded as leaseq.InvalidJob; leaseq.core.errors.translate turns it into one.
        RAISE EXCEPTION 'invalid %: %; nothing was written', field, problem
            USING ERRCODE = 'invalid_parameter_value', COLUMN = field, DETAIL = problem;
    END IF;

    INSERT INTO leaseq.jobs AS j (queue, job_type, payload, priority, max_attempts, available_at,
                                  timeout, idempotency_key, dedup_key, created_at, notify_done)
    VALUES (enqueue.queue, enqueue.job_type, coalesce(enqueue.payload, 'null'), enqueue.priority,
            enqueue.max_attempts,
            coalesce(enqueue.run_at, now() + make_interval(secs => enqueue.delay)),
            make_interval(secs => enqueue.timeout), enqueue.idempotency_key, enqueue.dedup_key, now(),
            coalesce(enqueue.wait, false))
    ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running')
    DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN
        SELECT j.id INTO new_id FROM leaseq.jobs j
         WHERE j.queue = enqueue.queue AND j.dedup_key = enqueue.dedup_key
           AND j.status IN ('pending', 'running');
        IF new_id IS NULL THEN
            RAISE EXCEPTION 'a job with dedup_key % in queue % exists but this call cannot see it: enqueued concurrently (retry to get its id) or by another database user',
                quote_literal(enqueue.dedup_key), quote_literal(enqueue.queue)
                USING ERRCODE = 'unique_violation';
        END IF;
        IF enqueue.wait THEN
            -- Committed already, maybe finishing now: the row lock orders the two (see above).
            UPDATE leaseq.jobs j SET notify_done = true
             WHERE j.id = new_id AND j.status IN ('pending', 'running') AND NOT j.notify_done;
        END IF;
        RETURN QUERY SELECT new_id, false;
        RETURN;
    END IF;
    PERFORM pg_notify('leaseq_jobs', enqueue.queue);
    RETURN QUERY SELECT new_id, true;
END
$fn$;

-- leaseq.apply_grants() of version 7 (which versions 9 and 10 wrap), restated without the
-- waiter table: the version 3 function does everything it did, then
-- producer: may flag the jobs it enqueued (the notify_done column only, and only its own rows),
--           and call leaseq.enqueue and leaseq.job_status.
-- The finishing roles need nothing new: the trigger only sends a notification.
CREATE OR REPLACE FUNCTION leaseq.apply_grants_v7(worker regrole, operator regrole, producer regrole)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    previous regrole[] := ARRAY(SELECT c.role_oid::regrole FROM leaseq.component_roles c
                                 WHERE EXISTS (SELECT 1 FROM pg_roles p WHERE p.oid = c.role_oid));
    r regrole;
    stmt text;
    stmts text[] := ARRAY[]::text[];
BEGIN
    RETURN QUERY SELECT s FROM leaseq.apply_grants_v3(worker, operator, producer) s;
    FOR r IN SELECT DISTINCT g FROM unnest(previous || ARRAY[worker, operator, producer]) g
              WHERE g IS NOT NULL LOOP
        stmts := stmts || format('REVOKE ALL ON FUNCTION leaseq.enqueue(text, text, jsonb, integer, timestamptz, double precision, integer, double precision, text, text, boolean), leaseq.job_status(bigint) FROM %s', r);
    END LOOP;
    IF producer IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT INSERT (notify_done), UPDATE (notify_done) ON leaseq.jobs TO %s', producer),
            format('CREATE POLICY leaseq_producer_watch ON leaseq.jobs FOR UPDATE TO %s USING (enqueued_by = current_user) WITH CHECK (enqueued_by = current_user)', producer),
            format('GRANT EXECUTE ON FUNCTION leaseq.enqueue(text, text, jsonb, integer, timestamptz, double precision, integer, double precision, text, text, boolean), leaseq.job_status(bigint) TO %s', producer)];
    END IF;
    FOREACH stmt IN ARRAY stmts LOOP
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.apply_grants_v7(regrole, regrole, regrole) FROM PUBLIC;
