-- leaseq's present tense: the worker's door, everything an attempt may change under its lease.
--
-- Covers: leaseq.lease_now, leaseq.lease_owner_session, leaseq.lease_run_at,
-- leaseq.lease_bounded, leaseq.lease_oversized, leaseq.lease_digests and the lease_*
-- functions: renewal, checkpoint, completion, failure, release, back-off, sleep, wait, the
-- record of a refused call, a durable step's intent, outcome and withdrawal, a stream item,
-- the read of a signal, and a fan-out (lease_spawn_lock, lease_spawn).
-- Set off by: the named statements of the same names in queries/ (jobs.sql, flow.sql,
-- signals.sql, steps.sql, streams.sql), run by leaseq.Queue for a worker.
--
-- Each function is SECURITY DEFINER, revoked from PUBLIC and granted to the worker role
-- (apply_grants, grants.sql), which has no INSERT or UPDATE of its own on a job, its
-- attempts, effects, steps, stream, edges or pipelines, nor SELECT of its signals; the
-- claims that lease a job are claims.sql's. Each takes the lease as
-- (job, holder, token, secret) and acts only while the job runs under that owner and token
-- on an unexpired lease and sha256(secret) is the digest its claim wrote
-- (leaseq.core.capability): the token every login can read is not enough. The functions
-- are one statement each (lease_wait: a lock, then one; lease_spawn: a fan-out's few), so the plans a worker's session
-- caches for them are a statement's (tests/integration/test_fenced_plans.py reads them).

-- Whether this session's login owns leaseq's tables (or is a member of their owner): asked
-- by leaseq.lease_now only when a caller passes its own time.
CREATE OR REPLACE FUNCTION leaseq.lease_owner_session()
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_has_role(session_user,
                       (SELECT c.relowner FROM pg_class c WHERE c.oid = 'leaseq.jobs'::regclass),
                       'USAGE')
$$;

REVOKE ALL ON FUNCTION leaseq.lease_owner_session() FROM PUBLIC;

-- The time a lease function runs at: database time, or `at` when the caller's login owns
-- leaseq's tables (tests move time through `now=`). A worker's clock never decides a lease:
-- a hostile worker passing an early `at` would otherwise revive its expired lease. Inlined
-- into its callers (no SET, no sub-select, every name qualified, as lease_token_next): a
-- call that passes no time costs a CASE, not a function call (one per claim cost about
-- 70 us here, a third of an empty claim).
CREATE OR REPLACE FUNCTION leaseq.lease_now(at timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN at IS NULL THEN pg_catalog.now()
                WHEN leaseq.lease_owner_session() THEN at
                ELSE pg_catalog.now() END
$$;

REVOKE ALL ON FUNCTION leaseq.lease_now(timestamptz) FROM PUBLIC;

-- `run_at` when a job handed back may wait until then: a finite time within 3650 days of now
-- (every reader of every tenant computes ages from it), else the API's error, and the
-- statement writes nothing. A hostile worker's sleep, wait, back-off or backoff policy
-- cannot park a job out of every reader's range.
CREATE OR REPLACE FUNCTION leaseq.lease_run_at(run_at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF NOT (isfinite(run_at) AND run_at <= now() + interval '3650 days') THEN
        RAISE EXCEPTION 'invalid run_at: must be a finite time within 3650 days of now, got %; nothing was written', run_at
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'run_at';
    END IF;
    RETURN run_at;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_run_at(timestamptz) FROM PUBLIC;

-- Raises the API's error for a JSON value of `size` bytes where `field` takes at most `lim`:
-- the statement that asked writes nothing.
CREATE OR REPLACE FUNCTION leaseq.lease_oversized(field text, size integer, lim integer)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RAISE EXCEPTION 'invalid %: is % bytes as JSON; the limit is %; nothing was written', field, size, lim
        USING ERRCODE = 'invalid_parameter_value', COLUMN = field,
              DETAIL = format('is %s bytes as JSON; the limit is %s', size, lim);
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_oversized(text, integer, integer) FROM PUBLIC;

-- `value` when it is at most `lim` bytes as JSON text (as readers get it), else the API's error
-- naming `field` (lease_oversized): the bounds leaseq's API checks, held by the database for
-- any caller of the door (a 50 MB step result or stream item written by a worker's own
-- connection would reach every reader of the job). Inlined into its callers (no SET, every
-- name qualified): a NULL, the commonest result, costs a comparison.
CREATE OR REPLACE FUNCTION leaseq.lease_bounded(field text, value jsonb, lim integer)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN pg_catalog.octet_length(value::text) > lim
                THEN leaseq.lease_oversized(field, pg_catalog.octet_length(value::text), lim)
                ELSE value END
$$;

REVOKE ALL ON FUNCTION leaseq.lease_bounded(text, jsonb, integer) FROM PUBLIC;

-- The digests (sha256) of `secrets`, in their order, hashing each run of equal secrets once:
-- the leases of one claim share its secret, and a batch of renewals or completions lists
-- them together. A hash is about 7,000 server instructions (OpenSSL's sha256 set up per
-- call), as much as the rest of a completion's work on its job. Every name qualified and no
-- SET, as lease_bounded: only the lease functions call it, under their pinned search_path.
CREATE OR REPLACE FUNCTION leaseq.lease_digests(secrets bytea[])
RETURNS bytea[]
LANGUAGE plpgsql IMMUTABLE
AS $fn$
DECLARE
    digests bytea[] := secrets;
    digest bytea;
BEGIN
    FOR i IN 1 .. coalesce(pg_catalog.cardinality(secrets), 0) LOOP
        IF i = 1 OR secrets[i] IS DISTINCT FROM secrets[i - 1] THEN
            digest := pg_catalog.sha256(secrets[i]);
        END IF;
        digests[i] := digest;
    END LOOP;
    RETURN digests;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_digests(bytea[]) FROM PUBLIC;

-- Extends held leases (one or many, in one statement), each fenced by its own owner, token and
-- secret, to lease_seconds from now, capped at started_at + timeout (the job's max runtime,
-- which counts as at most 100 years: a larger one would pass the last timestamp and fail
-- every renewal), and stores each one's progress; the ids and new lease ends of those still
-- held (a missing id's lease is lost).
CREATE OR REPLACE FUNCTION leaseq.lease_heartbeat_many(jobs bigint[], holders text[],
                                                       tokens bigint[], secrets bytea[],
                                                       progresses jsonb[],
                                                       lease_seconds double precision,
                                                       at timestamptz)
RETURNS TABLE (id bigint, lease_expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    -- At most a day a renewal: a job without a timeout is still reclaimed if its worker
    -- dies, however long it asked for.
    lease_heartbeat_many.lease_seconds := least(lease_heartbeat_many.lease_seconds, 86400);
    RETURN QUERY
    UPDATE leaseq.jobs j
       SET heartbeat_at = t.now,
           lease_expires_at = least(t.now + make_interval(secs => lease_heartbeat_many.lease_seconds),
                                    coalesce(j.started_at + least(j.timeout, interval '100 years'), 'infinity')),
           progress = coalesce(leaseq.lease_bounded('progress', r.progress, 65536), j.progress)
      FROM (SELECT leaseq.lease_now(lease_heartbeat_many.at) AS now) t,
           unnest(lease_heartbeat_many.jobs, lease_heartbeat_many.holders,
                  lease_heartbeat_many.tokens, leaseq.lease_digests(lease_heartbeat_many.secrets),
                  lease_heartbeat_many.progresses) AS r(id, holder, token, digest, progress)
     -- The ids as an array too: a probe of the primary key whatever the plan (joined only, a
     -- small table's generic plan hashed a scan of all of it).
     WHERE j.id = ANY (lease_heartbeat_many.jobs)
       AND j.id = r.id AND j.lease_owner = r.holder AND j.lease_token = r.token
       AND j.lease_digest = r.digest
       AND j.lease_expires_at > t.now
    RETURNING j.id, j.lease_expires_at;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_heartbeat_many(bigint[], text[], bigint[], bytea[], jsonb[], double precision, timestamptz) FROM PUBLIC;

-- Stores durable handler state for the next attempt; no row when the lease is not held.
CREATE OR REPLACE FUNCTION leaseq.lease_checkpoint(job bigint, holder text, token bigint,
                                                   secret bytea, state jsonb, at timestamptz)
RETURNS TABLE (id bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE leaseq.jobs j
       SET checkpoint = leaseq.lease_bounded('checkpoint', lease_checkpoint.state, 1048576)
     WHERE j.id = lease_checkpoint.job AND j.lease_owner = lease_checkpoint.holder
       AND j.lease_token = lease_checkpoint.token AND j.lease_digest = sha256(lease_checkpoint.secret)
       AND j.lease_expires_at > leaseq.lease_now(lease_checkpoint.at)
    RETURNING j.id;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_checkpoint(bigint, text, bigint, bytea, jsonb, timestamptz) FROM PUBLIC;

-- Marks held jobs succeeded (one or a batch, each fenced by its own owner, token and secret),
-- writes an effect for each job with a key (the one given, else its idempotency key; a key
-- another job's effect holds writes nothing, and the attempt's note says so; a job without a
-- key has its result in its own row only) within the job's queue and type, and records each
-- attempt (with its note, e.g. what was cut from the result), in one statement.
CREATE OR REPLACE FUNCTION leaseq.lease_complete(jobs bigint[], holders text[], tokens bigint[],
                                                 secrets bytea[], results jsonb[],
                                                 effect_keys text[], progresses jsonb[],
                                                 notes text[], at timestamptz)
RETURNS TABLE (id bigint, effect_key text, effect_written boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_complete.at) AS now),
    req AS (
        SELECT r.id, r.holder, r.token, r.digest, r.result, r.effect_key, r.progress, r.note
          FROM unnest(lease_complete.jobs, lease_complete.holders, lease_complete.tokens,
                      leaseq.lease_digests(lease_complete.secrets), lease_complete.results,
                      lease_complete.effect_keys, lease_complete.progresses,
                      lease_complete.notes)
               AS r(id, holder, token, digest, result, effect_key, progress, note)
    ),
    done AS (
        UPDATE leaseq.jobs j
           -- The digest goes with the lease: a finished row is as wide as before the capability
           -- (33 bytes less in the row and in the WAL of every completion).
           SET status = 'succeeded', finished_at = t.now, lease_expires_at = NULL, lease_digest = NULL,
               result = leaseq.lease_bounded('result', req.result, 1048576),
               progress = coalesce(leaseq.lease_bounded('progress', req.progress, 65536), j.progress)
          FROM t, req
         -- As in lease_heartbeat_many: the primary key whatever the plan.
         WHERE j.id = ANY (lease_complete.jobs)
           AND j.id = req.id AND j.lease_owner = req.holder
           AND j.lease_token = req.token AND j.lease_digest = req.digest
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.queue, j.job_type, j.attempt_count, j.lease_token, j.lease_owner,
                  j.started_at, j.finished_at,
                  coalesce(req.effect_key, j.idempotency_key) AS effect_key,
                  req.result, req.note
    ),
    effect AS (
        INSERT INTO leaseq.job_results (queue, job_type, idempotency_key, job_id, produced_by,
                                        produced_at, result)
        SELECT done.queue, done.job_type, done.effect_key, done.id, done.lease_owner,
               done.finished_at, coalesce(done.result, 'null'::jsonb)
          FROM done
         WHERE done.effect_key IS NOT NULL
        ON CONFLICT (queue, job_type, idempotency_key) DO NOTHING
        RETURNING job_id
    ),
    -- A key another job's effect holds drops this one: the attempt says so, so it is not silent.
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT done.id, done.attempt_count, done.lease_token, done.lease_owner, done.started_at,
               done.finished_at, 'succeeded',
               CASE WHEN done.effect_key IS NOT NULL
                     AND NOT EXISTS (SELECT 1 FROM effect e WHERE e.job_id = done.id)
                    THEN concat_ws('; ', done.note, 'effect not written: its key is held by another job''s effect (keys are per queue and job type, shared by every producer)')
                    ELSE done.note END
          FROM done
    )
    SELECT done.id, done.effect_key,
           EXISTS (SELECT 1 FROM effect e WHERE e.job_id = done.id) AS effect_written
      FROM done;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_complete(bigint[], text[], bigint[], bytea[], jsonb[], text[], jsonb[], text[], timestamptz) FROM PUBLIC;

-- Ends a held attempt with an error: back to pending after backoff if retryable with attempts
-- left; held (unfinished, waiting for an operator's `leaseq steps resolve`) if it stopped at an
-- uncertain durable step (error code StepUncertain, not retryable); else dead. Records the
-- attempt (outcome: failed or timed_out) with its traceback.
CREATE OR REPLACE FUNCTION leaseq.lease_fail(job bigint, holder text, token bigint, secret bytea,
                                             error text, error_code text, traceback text,
                                             retryable boolean, outcome leaseq.attempt_outcome,
                                             backoff_base double precision,
                                             backoff_cap double precision, at timestamptz)
RETURNS TABLE (id bigint, status text, available_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    IF lease_fail.outcome NOT IN ('failed', 'timed_out') THEN
        RAISE EXCEPTION 'a failed attempt''s outcome is failed or timed_out, got %; nothing was written', lease_fail.outcome
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_fail.at) AS now),
    failed AS (
        UPDATE leaseq.jobs j
           -- A held job is not finished: its waiters, stream, signals and pipeline wait on.
           SET status = CASE WHEN lease_fail.retryable AND j.attempt_count < j.max_attempts
                             THEN 'pending'
                             WHEN NOT lease_fail.retryable AND lease_fail.error_code = 'StepUncertain'
                             THEN 'held' ELSE 'dead' END::leaseq.job_status,
               available_at = CASE WHEN lease_fail.retryable AND j.attempt_count < j.max_attempts
                                   THEN leaseq.lease_run_at(t.now + leaseq.retry_delay(j.attempt_count, lease_fail.backoff_base, lease_fail.backoff_cap))
                                   ELSE j.available_at END,
               finished_at = CASE WHEN lease_fail.retryable AND j.attempt_count < j.max_attempts
                                  THEN NULL
                                  WHEN NOT lease_fail.retryable AND lease_fail.error_code = 'StepUncertain'
                                  THEN NULL ELSE t.now END,
               lease_owner = CASE WHEN lease_fail.retryable AND j.attempt_count < j.max_attempts
                                  THEN NULL ELSE j.lease_owner END,
               lease_expires_at = NULL,
               last_error = lease_fail.error,
               last_error_code = lease_fail.error_code
          FROM t
         WHERE j.id = lease_fail.job AND j.lease_owner = lease_fail.holder
           AND j.lease_token = lease_fail.token AND j.lease_digest = sha256(lease_fail.secret)
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.status, j.available_at, j.attempt_count, j.lease_token, j.started_at
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error,
                                         traceback)
        SELECT failed.id, failed.attempt_count, failed.lease_token, lease_fail.holder,
               failed.started_at, t.now, lease_fail.outcome, lease_fail.error, lease_fail.traceback
          FROM failed, t
    )
    SELECT failed.id, failed.status::text, failed.available_at FROM failed;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_fail(bigint, text, bigint, bytea, text, text, text, boolean, leaseq.attempt_outcome, double precision, double precision, timestamptz) FROM PUBLIC;

-- Gives a held job back, keeping its place in the queue. A shutdown release does not count
-- the attempt; any other (a handler raising Interrupted) counts it: retried after backoff, or
-- dead when attempts are used up. Token bumped; the attempt recorded (started at `started`);
-- wakes listeners.
CREATE OR REPLACE FUNCTION leaseq.lease_release(job bigint, holder text, token bigint,
                                                secret bytea, started timestamptz, reason text,
                                                shutdown boolean,
                                                backoff_base double precision,
                                                backoff_cap double precision, at timestamptz)
RETURNS TABLE (id bigint, status text, available_at timestamptz, notified bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_release.at) AS now),
    released AS (
        UPDATE leaseq.jobs j
           SET status = CASE WHEN NOT lease_release.shutdown AND j.attempt_count >= j.max_attempts
                             THEN 'dead' ELSE 'pending' END::leaseq.job_status,
               available_at = CASE WHEN lease_release.shutdown OR j.attempt_count >= j.max_attempts
                                   THEN j.available_at
                                   ELSE greatest(j.available_at,
                                                 leaseq.lease_run_at(t.now + leaseq.retry_delay(j.attempt_count, lease_release.backoff_base, lease_release.backoff_cap))) END,
               attempt_count = j.attempt_count - CASE WHEN lease_release.shutdown THEN 1 ELSE 0 END,
               finished_at = CASE WHEN NOT lease_release.shutdown AND j.attempt_count >= j.max_attempts THEN t.now END,
               lease_owner = CASE WHEN NOT lease_release.shutdown AND j.attempt_count >= j.max_attempts THEN j.lease_owner END,
               last_error = CASE WHEN lease_release.shutdown THEN j.last_error ELSE lease_release.reason END,
               last_error_code = CASE WHEN lease_release.shutdown THEN j.last_error_code ELSE 'INTERRUPTED' END,
               lease_token = j.lease_token + 1, lease_expires_at = NULL,
               started_at = NULL, heartbeat_at = NULL
          FROM t
         WHERE j.id = lease_release.job AND j.lease_owner = lease_release.holder
           AND j.lease_token = lease_release.token AND j.lease_digest = sha256(lease_release.secret)
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.queue, j.status, j.available_at,
                  j.attempt_count + CASE WHEN lease_release.shutdown THEN 1 ELSE 0 END AS attempt
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT released.id, released.attempt, lease_release.token, lease_release.holder,
               lease_release.started, t.now,
               CASE WHEN lease_release.shutdown THEN 'released' ELSE 'interrupted' END::leaseq.attempt_outcome,
               lease_release.reason
          FROM released, t
    ),
    woke AS (SELECT pg_notify('leaseq_jobs', released.queue) FROM released WHERE released.status = 'pending')
    SELECT released.id, released.status::text, released.available_at,
           (SELECT count(*) FROM woke)
      FROM released;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_release(bigint, text, bigint, bytea, timestamptz, text, boolean, double precision, double precision, timestamptz) FROM PUBLIC;

-- A handler told to back off (HTTP 429, Retry-After): hands a held job back without spending
-- an attempt, not before `seconds` from now, and pauses its key (if any) until then, in one
-- statement; token bumped; the attempt is recorded as released.
CREATE OR REPLACE FUNCTION leaseq.lease_back_off(job bigint, holder text, token bigint,
                                                 secret bytea, started timestamptz,
                                                 seconds double precision, reason text,
                                                 at timestamptz)
RETURNS TABLE (id bigint, status text, available_at timestamptz, paused_until timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_back_off.at) AS now),
    released AS (
        UPDATE leaseq.jobs j
           SET status = 'pending',
               available_at = greatest(j.available_at, leaseq.lease_run_at(t.now + make_interval(secs => lease_back_off.seconds))),
               attempt_count = j.attempt_count - 1,
               last_error = lease_back_off.reason, last_error_code = 'BACK_OFF',
               lease_token = j.lease_token + 1, lease_expires_at = NULL,
               started_at = NULL, heartbeat_at = NULL
          FROM t
         -- No status: a lease exists only while a job runs (jobs_lease_only_while_running), and
         -- naming status = 'running' lets the planner pick jobs_running_idx over the primary
         -- key when the statistics predate the running jobs (test_fenced_plans.py).
         WHERE j.id = lease_back_off.job AND j.lease_owner = lease_back_off.holder
           AND j.lease_token = lease_back_off.token AND j.lease_digest = sha256(lease_back_off.secret)
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.queue, j.key, j.available_at, j.attempt_count + 1 AS attempt
    ),
    paused AS (
        SELECT leaseq.flow_pause(r.queue, r.key, r.available_at) AS until
          FROM released r WHERE r.key IS NOT NULL
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT r.id, r.attempt, lease_back_off.token, lease_back_off.holder, lease_back_off.started,
               t.now, 'released', lease_back_off.reason
          FROM released r, t
    )
    SELECT r.id, 'pending'::text, r.available_at, (SELECT max(p.until) FROM paused p)
      FROM released r;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_back_off(bigint, text, bigint, bytea, timestamptz, double precision, text, timestamptz) FROM PUBLIC;

-- A handler sleeping durably (ctx.sleep): hands a held job back without spending an attempt,
-- claimable again at `until_at` (database time; at once if that has passed), in one
-- statement; token bumped, its key's unit given back by the status trigger; the attempt is
-- recorded as released with the wake time. It tells listeners when to claim it: NOTIFY
-- leaseq_jobs '<queue>' when it is claimable now, else '<queue> <seconds> <job type>', the
-- seconds from this statement's now to the wake time, so a worker times the wake by the
-- database's clock, never its own (leaseq.core.notifications).
CREATE OR REPLACE FUNCTION leaseq.lease_sleep(job bigint, holder text, token bigint, secret bytea,
                                              started timestamptz, until_at timestamptz,
                                              at timestamptz)
RETURNS TABLE (id bigint, status text, available_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_sleep.at) AS now),
    slept AS (
        UPDATE leaseq.jobs j
           SET status = 'pending',
               available_at = greatest(t.now, leaseq.lease_run_at(lease_sleep.until_at)),
               attempt_count = j.attempt_count - 1,
               lease_token = j.lease_token + 1, lease_expires_at = NULL,
               started_at = NULL, heartbeat_at = NULL
          FROM t
         WHERE j.id = lease_sleep.job AND j.lease_owner = lease_sleep.holder
           AND j.lease_token = lease_sleep.token AND j.lease_digest = sha256(lease_sleep.secret)
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.queue, j.job_type, j.available_at, j.attempt_count + 1 AS attempt
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT s.id, s.attempt, lease_sleep.token, lease_sleep.holder, lease_sleep.started, t.now,
               'released', 'sleeping until ' || s.available_at
          FROM slept s, t
    ),
    woke AS (
        SELECT pg_notify('leaseq_jobs',
                         CASE WHEN s.available_at <= t.now THEN s.queue
                              ELSE s.queue || ' ' || extract(epoch FROM s.available_at - t.now)
                                   || ' ' || s.job_type END)
          FROM slept s, t
    )
    -- Joined to the count so that the notification is sent (a CTE nobody reads never runs).
    SELECT s.id, 'pending'::text, s.available_at FROM slept s, (SELECT count(*) FROM woke) w;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_sleep(bigint, text, bigint, bytea, timestamptz, timestamptz, timestamptz) FROM PUBLIC;

-- A handler waiting for signal `signal_name` (ctx.wait_for): hands the held job back without
-- spending an attempt, claimable at `until_at` (database time) or at once if the signal is
-- there, showing what it waits for and since when; token bumped, its key's unit given back by
-- the status trigger; the attempt recorded as released. Two statements: the job's row is
-- locked first, then the signal is looked for in a fresh snapshot (a volatile function's next
-- statement takes one). A signal's insert locks the same row first (signals.sql), so
-- whichever comes second sees what the first committed.
CREATE OR REPLACE FUNCTION leaseq.lease_wait(job bigint, holder text, token bigint, secret bytea,
                                             started timestamptz, signal_name text,
                                             until_at timestamptz, at timestamptz)
RETURNS TABLE (id bigint, status text, available_at timestamptz, signalled boolean,
               notified bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM FROM leaseq.jobs j
      WHERE j.id = lease_wait.job AND j.lease_owner = lease_wait.holder
        AND j.lease_token = lease_wait.token AND j.lease_digest = sha256(lease_wait.secret)
        AND j.lease_expires_at > leaseq.lease_now(lease_wait.at)
        FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_wait.at) AS now),
    sent AS (
        SELECT EXISTS (SELECT 1 FROM leaseq.job_signals s
                        WHERE s.job_id = lease_wait.job AND s.name = lease_wait.signal_name) AS there
    ),
    waited AS (
        UPDATE leaseq.jobs j
           SET status = 'pending',
               available_at = CASE WHEN sent.there THEN t.now
                                   ELSE greatest(t.now, leaseq.lease_run_at(lease_wait.until_at)) END,
               waiting_for = lease_wait.signal_name, waiting_since = t.now,
               attempt_count = j.attempt_count - 1,
               lease_token = j.lease_token + 1, lease_expires_at = NULL,
               started_at = NULL, heartbeat_at = NULL
          FROM t, sent
         WHERE j.id = lease_wait.job AND j.lease_owner = lease_wait.holder
           AND j.lease_token = lease_wait.token AND j.lease_digest = sha256(lease_wait.secret)
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.queue, j.available_at, j.attempt_count + 1 AS attempt, sent.there
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT w.id, w.attempt, lease_wait.token, lease_wait.holder, lease_wait.started, t.now,
               'released',
               CASE WHEN w.there THEN 'signal ' || quote_literal(lease_wait.signal_name) || ' arrived while handing back'
                    ELSE 'waiting for signal ' || quote_literal(lease_wait.signal_name) || ' until ' || w.available_at END
          FROM waited w, t
    ),
    -- The signal came first: claimable now, so say so.
    woke AS (SELECT pg_notify('leaseq_jobs', w.queue) FROM waited w WHERE w.there)
    SELECT w.id, 'pending'::text, w.available_at, w.there, (SELECT count(*) FROM woke)
      FROM waited w;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_wait(bigint, text, bigint, bytea, timestamptz, text, timestamptz, timestamptz) FROM PUBLIC;

-- Records that a worker call was refused because the caller no longer holds the lease (a
-- reaped attempt becomes fenced; a cancelled or finished one keeps its outcome); returns the
-- job's status (NULL when the job does not exist) and how many rows it recorded. At the job's
-- current token only the secret's holder is recorded: anyone else could otherwise write the
-- holder's attempt row first (its completion would then collide with it).
CREATE OR REPLACE FUNCTION leaseq.lease_refused(job bigint, holder text, token bigint,
                                                secret bytea, attempt integer,
                                                started timestamptz, call text,
                                                at timestamptz)
RETURNS TABLE (status leaseq.job_status, recorded bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH job AS (
        SELECT j.id, j.status, j.lease_token, j.lease_expires_at,
               coalesce(j.lease_digest = sha256(lease_refused.secret), false) AS proven
          FROM leaseq.jobs j WHERE j.id = lease_refused.job
    ),
    refusal AS (
        SELECT job.id, t.at,
               lease_refused.call || ' refused: ' ||
               CASE WHEN job.status = 'running' AND job.lease_token = lease_refused.token
                    THEN 'the lease of token ' || job.lease_token || ' expired at '
                         || job.lease_expires_at || ' (job is running, not reaped yet)'
                    ELSE 'lease token ' || lease_refused.token || ' is not current (job is '
                         || job.status || ', token ' || job.lease_token || ')'
               END AS error
          FROM job, (SELECT leaseq.lease_now(lease_refused.at) AS at) t
         WHERE job.proven OR job.lease_token <> lease_refused.token
    ),
    -- A plain UPDATE, not ON CONFLICT DO UPDATE: an attempt that is not lease_expired is
    -- skipped here. A cancelled attempt stays cancelled: its worker hearing so is the
    -- cancellation working, not a fault. The attempt ended when the reaper took it: its end
    -- time stays (a later one would show the attempt holding its key's unit after the reaper
    -- gave it back); the error says when the call came.
    refenced AS (
        UPDATE leaseq.job_attempts a
           SET outcome = 'fenced',
               error = refusal.error || ' at ' || refusal.at || ' after ' || a.outcome::text
          FROM refusal
         WHERE a.job_id = refusal.id AND a.lease_token = lease_refused.token
           AND a.outcome = 'lease_expired'
        RETURNING a.job_id
    ),
    inserted AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT refusal.id, lease_refused.attempt, lease_refused.token, lease_refused.holder,
               lease_refused.started, refusal.at, 'fenced', refusal.error
          FROM refusal
        ON CONFLICT (job_id, lease_token) DO NOTHING
        RETURNING job_id
    )
    SELECT (SELECT job.status FROM job),
           (SELECT count(*) FROM refenced) + (SELECT count(*) FROM inserted);
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_refused(bigint, text, bigint, bytea, integer, timestamptz, text, timestamptz) FROM PUBLIC;

-- Commits the held attempt's intent to run step `step`: a new row, or the step's row without
-- an outcome whose intent is `seen_token` (the one the attempt saw; NULL: none); no row when
-- the lease is not held. A job records at most 10,000 steps, and a step's name is 1-200
-- characters (the API's bounds): past them, the API's error and nothing written. The job's row is locked FOR SHARE while the lease is checked: the
-- reaper's expiry (an UPDATE of that row) waits for it or it waits for the reaper and sees
-- the new token, so no step is written by an attempt whose lease another attempt holds.
CREATE OR REPLACE FUNCTION leaseq.lease_step_intend(job bigint, holder text, token bigint,
                                                    secret bytea, step text, seen_token bigint,
                                                    at timestamptz)
RETURNS TABLE (intended_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    IF length(lease_step_intend.step) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'invalid step: must be a name of 1-200 characters; nothing was written'
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'step',
                  DETAIL = 'must be a name of 1-200 characters';
    END IF;
    IF (SELECT count(*) FROM (SELECT 1 FROM leaseq.job_steps s
                               WHERE s.job_id = lease_step_intend.job AND s.name <> lease_step_intend.step
                               LIMIT 10000) n) >= 10000 THEN
        RAISE EXCEPTION 'invalid step: job % has recorded 10000 steps, the most a job records; nothing was written', lease_step_intend.job
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'step',
                  DETAIL = 'the job has 10000 steps, the most a job records: group work into fewer steps';
    END IF;
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_step_intend.at) AS now),
    held AS (
        SELECT j.id, j.attempt_count, j.lease_token FROM leaseq.jobs j, t
         WHERE j.id = lease_step_intend.job AND j.lease_owner = lease_step_intend.holder
           AND j.lease_token = lease_step_intend.token
           AND j.lease_digest = sha256(lease_step_intend.secret)
           AND j.lease_expires_at > t.now
           FOR SHARE OF j
    )
    INSERT INTO leaseq.job_steps AS s (job_id, name, attempt, lease_token, intended_at)
    SELECT held.id, lease_step_intend.step, held.attempt_count, held.lease_token, t.now FROM held, t
    ON CONFLICT (job_id, name) DO UPDATE
       SET attempt = excluded.attempt, lease_token = excluded.lease_token,
           intended_at = excluded.intended_at
     WHERE s.finished_at IS NULL AND s.lease_token IS NOT DISTINCT FROM lease_step_intend.seen_token
    RETURNING s.intended_at;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_step_intend(bigint, text, bigint, bytea, text, bigint, timestamptz) FROM PUBLIC;

-- Records the outcome of a step the held attempt intended; no row when the lease is not held
-- (the job's row locked FOR SHARE as in lease_step_intend).
CREATE OR REPLACE FUNCTION leaseq.lease_step_record(job bigint, holder text, token bigint,
                                                    secret bytea, step text, outcome jsonb,
                                                    note text, at timestamptz)
RETURNS TABLE (finished_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_step_record.at) AS now),
    held AS (
        SELECT j.id FROM leaseq.jobs j, t
         WHERE j.id = lease_step_record.job AND j.lease_owner = lease_step_record.holder
           AND j.lease_token = lease_step_record.token
           AND j.lease_digest = sha256(lease_step_record.secret)
           AND j.lease_expires_at > t.now
           FOR SHARE OF j
    )
    UPDATE leaseq.job_steps s
       SET finished_at = t.now,
           result = leaseq.lease_bounded('step result', lease_step_record.outcome, 1048576),
           note = lease_step_record.note
      FROM held, t
     WHERE s.job_id = held.id AND s.name = lease_step_record.step
       AND s.lease_token = lease_step_record.token AND s.finished_at IS NULL
    RETURNING s.finished_at;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_step_record(bigint, text, bigint, bytea, text, jsonb, text, timestamptz) FROM PUBLIC;

-- Withdraws the held attempt's intent of a step whose function raised (known not done); no
-- row when the lease is not held (the job's row locked FOR SHARE as in lease_step_intend).
CREATE OR REPLACE FUNCTION leaseq.lease_step_withdraw(job bigint, holder text, token bigint,
                                                      secret bytea, step text, at timestamptz)
RETURNS TABLE (name text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH held AS (
        SELECT j.id FROM leaseq.jobs j
         WHERE j.id = lease_step_withdraw.job AND j.lease_owner = lease_step_withdraw.holder
           AND j.lease_token = lease_step_withdraw.token
           AND j.lease_digest = sha256(lease_step_withdraw.secret)
           AND j.lease_expires_at > leaseq.lease_now(lease_step_withdraw.at)
           FOR SHARE OF j
    )
    UPDATE leaseq.job_steps s
       SET attempt = NULL, lease_token = NULL, intended_at = NULL
      FROM held
     WHERE s.job_id = held.id AND s.name = lease_step_withdraw.step
       AND s.lease_token = lease_step_withdraw.token AND s.finished_at IS NULL
    RETURNING s.name;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_step_withdraw(bigint, text, bigint, bytea, text, timestamptz) FROM PUBLIC;

-- Appends `item` to the held job's stream as its next item while it has fewer than `cap`
-- items (at most 10,000, the API's bound, whatever the caller asks); held is false when the
-- lease is not held, seq NULL when the stream is full. The job's row is locked FOR SHARE as
-- in lease_step_intend.
CREATE OR REPLACE FUNCTION leaseq.lease_emit(job bigint, holder text, token bigint, secret bytea,
                                             item jsonb, cap integer, at timestamptz)
RETURNS TABLE (held boolean, seq bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH held AS (
        SELECT j.id FROM leaseq.jobs j
         WHERE j.id = lease_emit.job AND j.lease_owner = lease_emit.holder
           AND j.lease_token = lease_emit.token AND j.lease_digest = sha256(lease_emit.secret)
           AND j.lease_expires_at > leaseq.lease_now(lease_emit.at)
           FOR SHARE OF j
    ),
    -- The last item by a backward scan of the primary key: one index entry, however long the
    -- stream (an aggregate over the join read every item of the job at each append).
    last AS (
        SELECT held.id,
               coalesce((SELECT s.seq FROM leaseq.job_stream s WHERE s.job_id = held.id
                          ORDER BY s.seq DESC LIMIT 1), 0) AS seq
          FROM held
    ),
    ins AS (
        INSERT INTO leaseq.job_stream (job_id, seq, value, at)
        SELECT last.id, last.seq + 1, leaseq.lease_bounded('stream item', lease_emit.item, 65536),
               leaseq.lease_now(lease_emit.at)
          FROM last WHERE last.seq < least(lease_emit.cap, 10000)
        RETURNING seq
    )
    SELECT EXISTS (SELECT 1 FROM held), (SELECT ins.seq FROM ins);
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_emit(bigint, text, bigint, bytea, jsonb, integer, timestamptz) FROM PUBLIC;

-- The signal `signal_name` of a job the caller holds: found, its payload; no row when the
-- lease is not held. The worker role reads no signal otherwise.
CREATE OR REPLACE FUNCTION leaseq.lease_signal(job bigint, holder text, token bigint,
                                               secret bytea, signal_name text, at timestamptz)
RETURNS TABLE (found boolean, payload jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH held AS (
        SELECT j.id FROM leaseq.jobs j
         WHERE j.id = lease_signal.job AND j.lease_owner = lease_signal.holder
           AND j.lease_token = lease_signal.token AND j.lease_digest = sha256(lease_signal.secret)
           AND j.lease_expires_at > leaseq.lease_now(lease_signal.at)
    )
    SELECT s.job_id IS NOT NULL, s.payload
      FROM held
      LEFT JOIN leaseq.job_signals s ON s.job_id = held.id AND s.name = lease_signal.signal_name;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_signal(bigint, text, bigint, bytea, text, timestamptz) FROM PUBLIC;

-- A fan-out's first half, in its spawner's completion transaction: while the lease holds,
-- marks the spawner and the existing jobs its graph waits for (parents: only those of the
-- spawner's producer, so no fan-out reaches into another producer's jobs) as parents, and
-- returns their id, status, pipeline and queue; no row when the lease does not hold (the
-- completion then fences and nothing is spawned). The row locks keep what was read until
-- commit: a parent's finish waits for them, so the status read is the one its trigger sees.
CREATE OR REPLACE FUNCTION leaseq.lease_spawn_lock(job bigint, holder text, token bigint,
                                                   secret bytea, parents bigint[],
                                                   at timestamptz)
RETURNS TABLE (id bigint, status text, pipeline_id bigint, queue text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH held AS (
        SELECT j.id, j.enqueued_by FROM leaseq.jobs j
         WHERE j.id = lease_spawn_lock.job AND j.lease_owner = lease_spawn_lock.holder
           AND j.lease_token = lease_spawn_lock.token AND j.status = 'running'
           AND j.lease_digest = sha256(lease_spawn_lock.secret)
           AND j.lease_expires_at > leaseq.lease_now(lease_spawn_lock.at)
           FOR UPDATE
    )
    UPDATE leaseq.jobs j SET has_children = true
      FROM held
     WHERE j.id = held.id
        OR (j.id = ANY(lease_spawn_lock.parents) AND j.enqueued_by = held.enqueued_by)
    RETURNING j.id, j.status::text, j.pipeline_id, j.queue;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_spawn_lock(bigint, text, bigint, bytea, bigint[], timestamptz) FROM PUBLIC;

-- A fan-out's second half, after lease_spawn_lock in the same transaction: inserts the
-- graph's jobs (node i of the arrays gets a fresh id; in the edges, -i names node i and a
-- positive id an existing job) with their edges, each job owned by the spawner's producer,
-- in the spawner's pipeline (grown and so reopened) or a new one of that producer's named
-- `name`, a node that inherits taking the spawner's flow key, each in the spawner's trace
-- (its trace context: a fan-out's first attempts are children of the enqueue's span); each into a queue open to that
-- producer (tenants.sql), else nothing is written and it says which queue. Only for a lease that holds;
-- returns the pipeline's id, no row otherwise. The caller counts each node's unmet parents
-- (deps_left) from what lease_spawn_lock returned: a fan-out is its own holder's to shape.
CREATE OR REPLACE FUNCTION leaseq.lease_spawn(job bigint, holder text, token bigint,
                                              secret bytea, name text, queues text[],
                                              job_types text[], payloads jsonb[],
                                              priorities smallint[], max_attempts integer[],
                                              run_ats timestamptz[], delays float8[],
                                              timeouts float8[], idempotency_keys text[],
                                              deps_left integer[], has_children boolean[],
                                              keys text[], inherits boolean[],
                                              parents bigint[], children bigint[],
                                              afters text[], counted boolean[],
                                              at timestamptz)
RETURNS TABLE (pipeline_id bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    spawner record;
    n integer := cardinality(lease_spawn.queues);
    ids bigint[];
    pipeline bigint;
    refused text;
BEGIN
    SELECT j.pipeline_id, j.key, j.enqueued_by, j.trace_context, leaseq.lease_now(lease_spawn.at) AS now
      INTO spawner
      FROM leaseq.jobs j
     WHERE j.id = lease_spawn.job AND j.lease_owner = lease_spawn.holder
       AND j.lease_token = lease_spawn.token AND j.status = 'running'
       AND j.lease_digest = sha256(lease_spawn.secret)
       AND j.lease_expires_at > leaseq.lease_now(lease_spawn.at);
    IF NOT FOUND OR n = 0 THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(lease_spawn.children) c WHERE c NOT BETWEEN -n AND -1)
       OR EXISTS (SELECT 1 FROM unnest(lease_spawn.parents) p WHERE p = 0 OR p < -n) THEN
        RAISE EXCEPTION 'a fan-out''s edges name its nodes as -1..-% and existing jobs by id', n
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'edges';
    END IF;
    SELECT q INTO refused FROM unnest(lease_spawn.queues) q
     WHERE NOT leaseq.queue_open_to(q, 'producer', spawner.enqueued_by) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'a fan-out of job % may not enqueue into queue %: the queue is given to other producer roles than its job''s producer', lease_spawn.job, refused
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    ids := ARRAY(SELECT nextval(pg_get_serial_sequence('leaseq.jobs', 'id'))
                   FROM generate_series(1, n));
    IF spawner.pipeline_id IS NULL THEN
        INSERT INTO leaseq.pipelines (name, total, created_at, created_by)
        VALUES (lease_spawn.name, n, spawner.now, spawner.enqueued_by)
        RETURNING leaseq.pipelines.id INTO pipeline;
    ELSE
        UPDATE leaseq.pipelines p SET total = p.total + n, finished_at = NULL
         WHERE p.id = spawner.pipeline_id;
        pipeline := spawner.pipeline_id;
    END IF;
    INSERT INTO leaseq.jobs (id, queue, job_type, payload, priority, max_attempts, available_at,
                             timeout, idempotency_key, created_at, status, deps_left,
                             has_children, pipeline_id, key, enqueued_by, trace_context)
    OVERRIDING SYSTEM VALUE
    SELECT ids[g.i], g.queue, g.job_type, g.payload, g.priority, g.max_attempts,
           coalesce(g.run_at, spawner.now + make_interval(secs => g.delay)),
           make_interval(secs => g.timeout), g.idempotency_key, spawner.now,
           CASE WHEN g.deps_left > 0 THEN 'waiting' ELSE 'pending' END::leaseq.job_status,
           g.deps_left, g.has_children, pipeline,
           CASE WHEN g.inherit THEN spawner.key ELSE g.key END, spawner.enqueued_by,
           spawner.trace_context
      FROM unnest(lease_spawn.queues, lease_spawn.job_types, lease_spawn.payloads,
                  lease_spawn.priorities, lease_spawn.max_attempts, lease_spawn.run_ats,
                  lease_spawn.delays, lease_spawn.timeouts, lease_spawn.idempotency_keys,
                  lease_spawn.deps_left, lease_spawn.has_children, lease_spawn.keys,
                  lease_spawn.inherits)
           WITH ORDINALITY AS g(queue, job_type, payload, priority, max_attempts, run_at,
                                delay, timeout, idempotency_key, deps_left, has_children,
                                key, inherit, i);
    INSERT INTO leaseq.job_deps (parent_id, child_id, after, counted)
    SELECT CASE WHEN e.parent < 0 THEN ids[-e.parent] ELSE e.parent END, ids[-e.child],
           e.after, e.counted
      FROM unnest(lease_spawn.parents, lease_spawn.children, lease_spawn.afters,
                  lease_spawn.counted) AS e(parent, child, after, counted);
    RETURN QUERY SELECT pipeline;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_spawn(bigint, text, bigint, bytea, text, text[], text[], jsonb[], smallint[], integer[], timestamptz[], float8[], float8[], text[], integer[], boolean[], text[], boolean[], bigint[], bigint[], text[], boolean[], timestamptz) FROM PUBLIC;
