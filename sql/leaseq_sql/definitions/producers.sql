-- leaseq's present tense: what a producer in any language calls.
--
-- Covers: leaseq.enqueue, leaseq.job_status. Granted to the producer role by apply_grants
-- (grants.sql); nobody else may execute them.
-- Set off by: other languages' producers; Python enqueues through job_enqueue instead (the
-- same checks and wording, tests/integration/test_sql_functions.py).

-- Enqueues one job from any language, with the checks and the wording of the Python API;
-- the wait flag is the job's own column (notify_done). `traceparent` and `tracestate` are
-- the W3C trace context the job's first attempt continues (the caller's span, as
-- Queue.enqueue's trace_context), checked as leaseq.core.tracing checks them.
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
    wait boolean DEFAULT false,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL
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
    ELSIF enqueue.delay > 315360000 THEN
        field := 'delay'; problem := format('must be at most 315360000 seconds (3650 days), got %s', enqueue.delay);
    ELSIF enqueue.max_attempts IS NULL OR enqueue.max_attempts < 1 THEN
        field := 'max_attempts'; problem := format('must be at least 1, got %s', coalesce(enqueue.max_attempts::text, 'NULL'));
    ELSIF enqueue.max_attempts > 1000 THEN
        field := 'max_attempts'; problem := format('must be at most 1000, got %s', enqueue.max_attempts);
    ELSIF enqueue.timeout IN ('NaN', 'Infinity', '-Infinity') THEN
        field := 'timeout'; problem := format('must be a finite number, got %s', enqueue.timeout);
    ELSIF enqueue.timeout < 0 THEN
        field := 'timeout'; problem := format('must not be negative, got %s', enqueue.timeout);
    ELSIF enqueue.timeout = 0 THEN
        field := 'timeout'; problem := 'must be greater than zero';
    ELSIF enqueue.timeout > 315360000 THEN
        field := 'timeout'; problem := format('must be at most 315360000 seconds (3650 days), got %s', enqueue.timeout);
    ELSIF enqueue.idempotency_key = '' THEN
        field := 'idempotency_key'; problem := 'must be a non-empty string or None';
    ELSIF length(enqueue.idempotency_key) > 512 THEN
        field := 'idempotency_key'; problem := format('is %s characters long; the limit is 512', length(enqueue.idempotency_key));
    ELSIF enqueue.dedup_key = '' THEN
        field := 'dedup_key'; problem := 'must be a non-empty string or None';
    ELSIF length(enqueue.dedup_key) > 512 THEN
        field := 'dedup_key'; problem := format('is %s characters long; the limit is 512', length(enqueue.dedup_key));
    ELSIF enqueue.traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
        field := 'traceparent'; problem := format('must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>), got %L', left(enqueue.traceparent, 64));
    ELSIF enqueue.tracestate IS NOT NULL AND enqueue.traceparent IS NULL THEN
        field := 'tracestate'; problem := 'needs a traceparent';
    ELSIF length(enqueue.tracestate) > 512 THEN
        field := 'tracestate'; problem := format('is %s characters long; the limit is 512', length(enqueue.tracestate));
    END IF;
    IF field IS NOT NULL THEN
        -- Worded as leaseq.InvalidJob; leaseq.core.errors.translate turns it into one.
        RAISE EXCEPTION 'invalid %: %; nothing was written', field, problem
            USING ERRCODE = 'invalid_parameter_value', COLUMN = field, DETAIL = problem;
    END IF;

    INSERT INTO leaseq.jobs AS j (queue, job_type, payload, priority, max_attempts, available_at,
                                  timeout, idempotency_key, dedup_key, created_at, notify_done,
                                  trace_context)
    VALUES (enqueue.queue, enqueue.job_type, coalesce(enqueue.payload, 'null'), enqueue.priority,
            enqueue.max_attempts,
            coalesce(enqueue.run_at, now() + make_interval(secs => enqueue.delay)),
            make_interval(secs => enqueue.timeout), enqueue.idempotency_key, enqueue.dedup_key, now(),
            coalesce(enqueue.wait, false),
            CASE WHEN enqueue.traceparent IS NOT NULL
                 THEN jsonb_strip_nulls(jsonb_build_object('traceparent', enqueue.traceparent,
                                                           'tracestate', enqueue.tracestate))
            END)
    ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running')
    DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN
        SELECT j.id INTO new_id FROM leaseq.jobs j
         WHERE j.queue = enqueue.queue AND j.dedup_key = enqueue.dedup_key
           AND j.status IN ('pending', 'running');
        IF new_id IS NULL THEN
            -- Worded so it does not tell whose job holds the key (docs/guides/security.md).
            RAISE EXCEPTION 'dedup_key % in queue % is held by an unfinished job this call cannot read: retry to get its id if it was enqueued concurrently; dedup keys are per queue across all producers, so make yours unique to your application (a prefix)',
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

REVOKE ALL ON FUNCTION leaseq.enqueue(text, text, jsonb, integer, timestamptz, double precision,
    integer, double precision, text, text, boolean, text, text) FROM PUBLIC;

-- Where a job stands, as the caller may see it (a producer: only the jobs it enqueued); no
-- row when there is no such job.
CREATE OR REPLACE FUNCTION leaseq.job_status(job_id bigint)
RETURNS TABLE (status text, result jsonb, last_error text, last_error_code text,
               attempts integer)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.status, j.result, j.last_error, j.last_error_code, j.attempt_count
      FROM leaseq.job_view j
     WHERE j.id = job_status.job_id
$$;

REVOKE ALL ON FUNCTION leaseq.job_status(bigint) FROM PUBLIC;
