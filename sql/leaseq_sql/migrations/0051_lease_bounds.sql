-- leaseq schema: the API's bounds, held by the worker's door (issue 59, bounds in the database).
--
-- A worker login's own connection wrote a 50 MB step result, a 50 MB stream item and
-- 100,000 steps on one job: the caps existed only in Python. The door now refuses, in the
-- API's words (SQLSTATE 22023 with the field in COLUMN, leaseq.InvalidJob), a step result,
-- result or checkpoint over 1,048,576 bytes as JSON, a stream item or progress over 65,536,
-- a step name outside 1-200 characters, and a job's 10,001st step. The size check is
-- inlined (leaseq.lease_bounded); leaseq.lease_oversized only raises.

CREATE OR REPLACE FUNCTION leaseq.lease_oversized(field text, size integer, lim integer)
 RETURNS jsonb
 LANGUAGE plpgsql
 IMMUTABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    RAISE EXCEPTION 'invalid %: is % bytes as JSON; the limit is %; nothing was written', field, size, lim
        USING ERRCODE = 'invalid_parameter_value', COLUMN = field,
              DETAIL = format('is %s bytes as JSON; the limit is %s', size, lim);
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_oversized(text,integer,integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_bounded(field text, value jsonb, lim integer)
 RETURNS jsonb
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN pg_catalog.octet_length(value::text) > lim
                THEN leaseq.lease_oversized(field, pg_catalog.octet_length(value::text), lim)
                ELSE value END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_bounded(text,jsonb,integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_checkpoint(job bigint, holder text, token bigint, secret bytea, state jsonb, at timestamp with time zone)
 RETURNS TABLE(id bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE leaseq.jobs j
       SET checkpoint = leaseq.lease_bounded('checkpoint', lease_checkpoint.state, 1048576)
     WHERE j.id = lease_checkpoint.job AND j.lease_owner = lease_checkpoint.holder
       AND j.lease_token = lease_checkpoint.token AND j.lease_digest = sha256(lease_checkpoint.secret || int8send(j.id))
       AND j.lease_expires_at > leaseq.lease_now(lease_checkpoint.at)
    RETURNING j.id;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_complete(jobs bigint[], holders text[], tokens bigint[], secrets bytea[], results jsonb[], effect_keys text[], progresses jsonb[], notes text[], at timestamp with time zone)
 RETURNS TABLE(id bigint, effect_key text, effect_written boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_complete.at) AS now),
    req AS (
        SELECT r.id, r.holder, r.token, r.secret, r.result, r.effect_key, r.progress, r.note
          FROM unnest(lease_complete.jobs, lease_complete.holders, lease_complete.tokens,
                      lease_complete.secrets, lease_complete.results,
                      lease_complete.effect_keys, lease_complete.progresses,
                      lease_complete.notes)
               AS r(id, holder, token, secret, result, effect_key, progress, note)
    ),
    done AS (
        UPDATE leaseq.jobs j
           SET status = 'succeeded', finished_at = t.now, lease_expires_at = NULL,
               result = leaseq.lease_bounded('result', req.result, 1048576),
               progress = coalesce(leaseq.lease_bounded('progress', req.progress, 65536), j.progress)
          FROM t, req
         -- As in lease_heartbeat_many: the primary key whatever the plan.
         WHERE j.id = ANY (lease_complete.jobs)
           AND j.id = req.id AND j.lease_owner = req.holder
           AND j.lease_token = req.token AND j.lease_digest = sha256(req.secret || int8send(j.id))
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
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_emit(job bigint, holder text, token bigint, secret bytea, item jsonb, cap integer, at timestamp with time zone)
 RETURNS TABLE(held boolean, seq bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH held AS (
        SELECT j.id FROM leaseq.jobs j
         WHERE j.id = lease_emit.job AND j.lease_owner = lease_emit.holder
           AND j.lease_token = lease_emit.token AND j.lease_digest = sha256(lease_emit.secret || int8send(j.id))
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
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_heartbeat(job bigint, holder text, token bigint, secret bytea, lease_seconds double precision, progress jsonb, at timestamp with time zone)
 RETURNS TABLE(lease_expires_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE leaseq.jobs j
       SET heartbeat_at = t.now,
           lease_expires_at = least(t.now + make_interval(secs => lease_heartbeat.lease_seconds),
                                    coalesce(j.started_at + least(j.timeout, interval '100 years'), 'infinity')),
           progress = coalesce(leaseq.lease_bounded('progress', lease_heartbeat.progress, 65536), j.progress)
      FROM (SELECT leaseq.lease_now(lease_heartbeat.at) AS now) t
     WHERE j.id = lease_heartbeat.job AND j.lease_owner = lease_heartbeat.holder
       AND j.lease_token = lease_heartbeat.token AND j.lease_digest = sha256(lease_heartbeat.secret || int8send(j.id))
       AND j.lease_expires_at > t.now
    RETURNING j.lease_expires_at;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_heartbeat_many(jobs bigint[], holders text[], tokens bigint[], secrets bytea[], progresses jsonb[], lease_seconds double precision, at timestamp with time zone)
 RETURNS TABLE(id bigint, lease_expires_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE leaseq.jobs j
       SET heartbeat_at = t.now,
           lease_expires_at = least(t.now + make_interval(secs => lease_heartbeat_many.lease_seconds),
                                    coalesce(j.started_at + least(j.timeout, interval '100 years'), 'infinity')),
           progress = coalesce(leaseq.lease_bounded('progress', r.progress, 65536), j.progress)
      FROM (SELECT leaseq.lease_now(lease_heartbeat_many.at) AS now) t,
           unnest(lease_heartbeat_many.jobs, lease_heartbeat_many.holders,
                  lease_heartbeat_many.tokens, lease_heartbeat_many.secrets,
                  lease_heartbeat_many.progresses) AS r(id, holder, token, secret, progress)
     -- The ids as an array too: a probe of the primary key whatever the plan (joined only, a
     -- small table's generic plan hashed a scan of all of it).
     WHERE j.id = ANY (lease_heartbeat_many.jobs)
       AND j.id = r.id AND j.lease_owner = r.holder AND j.lease_token = r.token
       AND j.lease_digest = sha256(r.secret || int8send(j.id))
       AND j.lease_expires_at > t.now
    RETURNING j.id, j.lease_expires_at;
END
$function$
;


CREATE OR REPLACE FUNCTION leaseq.lease_step_intend(job bigint, holder text, token bigint, secret bytea, step text, seen_token bigint, at timestamp with time zone)
 RETURNS TABLE(intended_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
           AND j.lease_digest = sha256(lease_step_intend.secret || int8send(j.id))
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
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_step_record(job bigint, holder text, token bigint, secret bytea, step text, outcome jsonb, note text, at timestamp with time zone)
 RETURNS TABLE(finished_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_step_record.at) AS now),
    held AS (
        SELECT j.id FROM leaseq.jobs j, t
         WHERE j.id = lease_step_record.job AND j.lease_owner = lease_step_record.holder
           AND j.lease_token = lease_step_record.token
           AND j.lease_digest = sha256(lease_step_record.secret || int8send(j.id))
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
$function$
;
