-- leaseq schema: a job stopped at an uncertain durable step is held, not dead.
-- A job whose handler met a step intended by an earlier attempt without an outcome
-- (StepUncertain) became dead: its stream ended, result() raised JobDead, its pipeline was
-- reported failed and signals to it were refused, although `leaseq steps resolve` brings it
-- back and it may then succeed with nobody listening. It now waits in the status held:
-- unfinished (no finished_at), so waiters, streams, signals and pipelines wait on; its lease
-- (and a flow-control key's unit) is given back as on any end of an attempt; the operator's
-- settle (step_resolve) makes it pending again, as does nothing else; cancel_jobs cancels it;
-- an ordered aggregate waits behind a held head (flow_on_enqueue_ordered, flow_promote).
-- Jobs already dead at an uncertain step stay dead and step_resolve still settles them:
-- a value added to an enum cannot be used in the transaction that added it (PostgreSQL
-- raises "unsafe use of new value"), which is also why step_resolve compares status as text.
-- Before running: jobs_finished_at says finished is status > 'running' (migration 25).

ALTER TYPE leaseq.job_status ADD VALUE 'held' BEFORE 'running';
-- Held jobs per queue (leaseq status, the operator's leaseq_queue_jobs{state="held"}) and the
-- list `leaseq steps list` shows, without a scan of every job. Its predicate names no new
-- value (see above): of unfinished jobs, only a held one is in none of these statuses.
CREATE INDEX jobs_held_idx ON leaseq.jobs (id)
    WHERE finished_at IS NULL AND status NOT IN ('waiting', 'pending', 'running');

CREATE OR REPLACE FUNCTION leaseq.cancel_jobs(job_ids bigint[], pipeline bigint, actor text, reason text, at timestamp with time zone, owned_by text DEFAULT NULL::text)
 RETURNS TABLE(id bigint, previous_status text, ancestor bigint)
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    passes integer := 0;
    found_now bigint;
BEGIN
    IF length(reason) > 2000 THEN
        RAISE EXCEPTION 'invalid reason: is % characters long; the limit is 2000; nothing was cancelled', length(reason)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'reason',
                  DETAIL = format('is %s characters long; the limit is 2000', length(reason));
    END IF;
    LOOP
        passes := passes + 1;
        RETURN QUERY
        WITH RECURSIVE tree (id, root) AS (
            SELECT r, r FROM unnest(job_ids) AS r
            UNION
            SELECT d.child_id, tree.root FROM tree JOIN leaseq.job_deps d ON d.parent_id = tree.id
             WHERE owned_by IS NULL
                OR EXISTS (SELECT 1 FROM leaseq.jobs o WHERE o.id = d.child_id AND o.enqueued_by = owned_by)
        ),
        target AS (
            -- A job under two of the jobs named is cancelled with the first.
            SELECT tree.id, min(tree.root) AS root FROM tree GROUP BY tree.id
            UNION ALL
            SELECT j.id, NULL FROM leaseq.jobs j
             WHERE j.pipeline_id = pipeline AND j.status IN ('waiting', 'pending', 'running', 'held')
        ),
        cur AS (
            SELECT j.id, j.status, j.lease_owner, j.lease_token, j.attempt_count, j.started_at,
                   target.root,
                   CASE WHEN target.root = j.id AND actor IS NULL THEN coalesce(reason, 'cancelled')
                        ELSE CASE WHEN target.root IS NULL THEN format('cancelled with pipeline %s', pipeline)
                                  WHEN target.root = j.id THEN 'cancelled'
                                  ELSE format('cancelled with ancestor job %s', target.root) END
                             || coalesce(' by ' || actor, '') || coalesce(': ' || reason, '') END AS why,
                   CASE WHEN target.root IS NULL THEN 'PIPELINE_CANCELLED'
                        WHEN target.root = j.id THEN 'CANCELLED'
                        ELSE 'ANCESTOR_CANCELLED' END AS code
              FROM leaseq.jobs j JOIN target ON target.id = j.id
             WHERE j.status IN ('waiting', 'pending', 'running', 'held')
               AND (owned_by IS NULL OR j.enqueued_by = owned_by)
             ORDER BY j.id
               FOR UPDATE OF j
        ),
        cancelled AS (
            UPDATE leaseq.jobs j
               SET status = 'cancelled', finished_at = at, lease_expires_at = NULL,
                   last_error = cur.why, last_error_code = cur.code
              FROM cur
             WHERE j.id = cur.id
            RETURNING j.id
        ),
        attempt AS (
            INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at,
                                             outcome, error)
            SELECT cur.id, cur.attempt_count, cur.lease_token, cur.lease_owner, cur.started_at, at,
                   'cancelled', cur.why
              FROM cur JOIN cancelled USING (id)
             WHERE cur.status = 'running'
            -- An attempt a refused call already ended on an expired lease stays fenced.
            ON CONFLICT (job_id, lease_token) DO NOTHING
        )
        SELECT cur.id, cur.status::text, cur.root FROM cur JOIN cancelled USING (id) ORDER BY cur.id;
        GET DIAGNOSTICS found_now = ROW_COUNT;
        -- The first pass may find nothing only because a completion ended the job it waited
        -- for: the second always runs.
        EXIT WHEN (found_now = 0 AND passes >= 2) OR passes = 3;
    END LOOP;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.flow_on_enqueue_ordered()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    seq bigint;
    blocked bigint;
BEGIN
    INSERT INTO leaseq.flow_aggregates AS a (queue, ordering_key, next_seq)
    VALUES (NEW.queue, NEW.ordering_key, 2)
    ON CONFLICT (queue, ordering_key) DO UPDATE SET next_seq = a.next_seq + 1
    RETURNING a.next_seq - 1, a.blocked_by INTO seq, blocked;
    NEW.ordering_seq := seq;
    -- A new statement, so a fresh snapshot: every job enqueued before the lock was taken
    -- is visible.
    NEW.ordering_waiting := blocked IS NOT NULL OR EXISTS (
        SELECT 1 FROM leaseq.jobs j
         WHERE j.queue = NEW.queue AND j.ordering_key = NEW.ordering_key
           AND j.status IN ('pending', 'running'))
        -- A head held at an uncertain step is unfinished: nothing behind it starts, as behind
        -- a dead one. Through jobs_held_idx (its predicate: only a held job is unfinished in
        -- none of these statuses); held jobs are few.
        OR EXISTS (
        SELECT 1 FROM leaseq.jobs j
         WHERE j.finished_at IS NULL AND j.status NOT IN ('waiting', 'pending', 'running')
           AND j.queue = NEW.queue AND j.ordering_key = NEW.ordering_key);
    RETURN NEW;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.flow_promote(q text, ok text)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    head bigint;
BEGIN
    -- The aggregate's row lock orders this against enqueues of the same aggregate.
    UPDATE leaseq.flow_aggregates a SET blocked_by = NULL, blocked_at = NULL
     WHERE a.queue = q AND a.ordering_key = ok;
    IF EXISTS (SELECT 1 FROM leaseq.jobs j
                WHERE j.queue = q AND j.ordering_key = ok AND j.status IN ('pending', 'running')
                  AND NOT j.ordering_waiting)
       -- A held head (jobs_held_idx, as in flow_on_enqueue_ordered).
       OR EXISTS (SELECT 1 FROM leaseq.jobs j
                   WHERE j.finished_at IS NULL AND j.status NOT IN ('waiting', 'pending', 'running')
                     AND j.queue = q AND j.ordering_key = ok) THEN
        RETURN NULL;
    END IF;
    UPDATE leaseq.jobs j SET ordering_waiting = false
     WHERE j.id = (SELECT x.id FROM leaseq.jobs x
                    WHERE x.queue = q AND x.ordering_key = ok AND x.status IN ('pending', 'running')
                    ORDER BY x.ordering_seq LIMIT 1)
    RETURNING j.id INTO head;
    IF head IS NOT NULL THEN
        PERFORM pg_notify('leaseq_jobs', q);
    END IF;
    RETURN head;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.jobs_on_status()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    -- jobs_flow_head_done: the head of an aggregate finished.
    IF OLD.ordering_key IS NOT NULL AND NOT OLD.ordering_waiting AND OLD.finished_at IS NULL
       AND NEW.finished_at IS NOT NULL AND OLD.status <> 'waiting' THEN
        IF NEW.status = 'dead' THEN
            UPDATE leaseq.flow_aggregates a SET blocked_by = NEW.id, blocked_at = now()
             WHERE a.queue = NEW.queue AND a.ordering_key = NEW.ordering_key;
        ELSE
            PERFORM leaseq.flow_promote(NEW.queue, NEW.ordering_key);
        END IF;
    END IF;
    -- jobs_flow_head_revived: a dead head retried.
    IF OLD.ordering_key IS NOT NULL AND OLD.status = 'dead' AND NEW.status = 'pending' THEN
        UPDATE leaseq.flow_aggregates a SET blocked_by = NULL, blocked_at = NULL
         WHERE a.queue = NEW.queue AND a.ordering_key = NEW.ordering_key AND a.blocked_by = NEW.id;
    END IF;
    -- jobs_flow_reactivate: a keyed job pending again after it finished, waited or was held.
    IF NEW.key IS NOT NULL AND NEW.status = 'pending'
       AND (OLD.finished_at IS NOT NULL OR OLD.status IN ('waiting', 'held')) THEN
        PERFORM leaseq.flow_activate(NEW.queue, NEW.key);
    END IF;
    -- jobs_flow_release: a keyed job leaves running.
    IF OLD.key IS NOT NULL AND OLD.lease_expires_at IS NOT NULL AND NEW.lease_expires_at IS NULL THEN
        -- As flow_on_leave_running was in migration 24.
        DECLARE
            last_one boolean := NEW.status <> 'pending' AND NOT leaseq.flow_key_pending(OLD.queue, OLD.key);
            ran double precision := greatest(extract(epoch FROM coalesce(NEW.finished_at, now()) - OLD.started_at), 0);
            charged boolean := false;
            lim integer;
            freed integer;
        BEGIN
            -- An attempt shorter than 50 ms is charged 50 ms with probability ran / 50 ms: the same
            -- charge in expectation, and a key's row is rewritten by 1 in 50 of its 1 ms jobs, not
            -- by every one (its completions would queue on that row). A lone key is not charged.
            IF ran >= 0.05 OR random() * 0.05 < ran THEN
                UPDATE leaseq.flow_keys f SET vtime = f.vtime + greatest(ran, 0.05) / f.weight
                 WHERE f.queue = OLD.queue AND f.key = OLD.key
                   AND EXISTS (SELECT 1 FROM leaseq.flow_keys o
                                WHERE o.queue = OLD.queue AND o.active AND o.key <> OLD.key)
                RETURNING f.max_running INTO lim;
                charged := FOUND;
            END IF;
            -- The key's row before the slot: the lock order of leaseq.flow_apply (no deadlock with a
            -- limit being changed). Read under the lock, its limit is current: an unlimited key has
            -- no slots, and a limited key's retired slots are those numbered past its limit.
            IF charged THEN
                NULL;
            ELSIF last_one THEN
                SELECT f.max_running INTO lim FROM leaseq.flow_keys f
                 WHERE f.queue = OLD.queue AND f.key = OLD.key FOR UPDATE;
            ELSE
                SELECT f.max_running INTO lim FROM leaseq.flow_keys f
                 WHERE f.queue = OLD.queue AND f.key = OLD.key FOR KEY SHARE;
            END IF;
            IF lim IS NOT NULL THEN
                -- Twice at most: another release of the key may have compacted this unit into a
                -- free slot after the first look's snapshot. The first look waited for that
                -- commit, and the second (a new statement, a new snapshot) sees where it went.
                FOR look IN 1..2 LOOP
                    UPDATE leaseq.flow_slots s SET job_id = NULL, lease_token = NULL, taken_at = NULL
                     WHERE s.job_id = OLD.id AND s.lease_token = OLD.lease_token
                       AND s.queue = OLD.queue AND s.key = OLD.key
                    RETURNING s.slot INTO freed;
                    EXIT WHEN freed IS NOT NULL;
                END LOOP;
                -- A lowered limit still draining: keep its extra units last.
                IF EXISTS (SELECT 1 FROM leaseq.flow_slots s
                            WHERE s.queue = OLD.queue AND s.key = OLD.key AND s.slot > lim) THEN
                    PERFORM leaseq.flow_compact(OLD.queue, OLD.key);
                END IF;
            END IF;
            IF last_one THEN
                UPDATE leaseq.flow_keys f SET active = false
                 WHERE f.queue = OLD.queue AND f.key = OLD.key AND f.active
                   -- A new statement under the key's row lock: an enqueue that committed since
                   -- last_one's snapshot is seen, and so is any job of the key still running.
                   AND NOT leaseq.flow_key_pending(OLD.queue, OLD.key)
                   AND (SELECT j.id FROM leaseq.jobs j
                         WHERE j.status = 'running' AND j.key IS NOT NULL
                           AND j.queue = OLD.queue AND j.key = OLD.key
                         ORDER BY j.id DESC LIMIT 1) IS NULL;
            ELSIF freed IS NOT NULL THEN
                IF NOT EXISTS (SELECT 1 FROM leaseq.flow_slots s
                                WHERE s.queue = OLD.queue AND s.key = OLD.key AND s.job_id IS NULL
                                  AND NOT s.retired AND s.slot <> freed)
                   AND EXISTS (SELECT 1 FROM leaseq.jobs j
                                WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
                                  AND j.queue = OLD.queue AND j.key = OLD.key AND j.available_at <= now()) THEN
                    PERFORM pg_notify('leaseq_jobs', OLD.queue);
                END IF;
            END IF;
        END;
    END IF;
    -- jobs_notify_done: a watched job finished.
    IF NEW.notify_done AND NEW.finished_at IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status THEN
        PERFORM pg_notify('leaseq_done', NEW.id::text);
    END IF;
    -- jobs_pipeline_transition: a job of a pipeline, or with children, changed status, and
    -- was or is finished (pipeline_transition did nothing for any other change).
    IF OLD.status IS DISTINCT FROM NEW.status AND (NEW.has_children OR NEW.pipeline_id IS NOT NULL)
       AND (OLD.finished_at IS NOT NULL OR NEW.finished_at IS NOT NULL) THEN
        PERFORM leaseq.pipeline_changed(OLD, NEW);
    END IF;
    RETURN NULL;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_fail(job bigint, holder text, token bigint, secret bytea, error text, error_code text, traceback text, retryable boolean, outcome leaseq.attempt_outcome, backoff_base double precision, backoff_cap double precision, at timestamp with time zone)
 RETURNS TABLE(id bigint, status text, available_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
;

CREATE OR REPLACE FUNCTION leaseq.step_resolve(job bigint, step text, outcome jsonb, again boolean, actor text, reason text, at timestamp with time zone)
 RETURNS TABLE(id bigint, notified bigint)
 LANGUAGE sql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    WITH t AS (SELECT coalesce(step_resolve.at, now()) AS now),
    settled AS (
        UPDATE leaseq.job_steps s
           SET finished_at = CASE WHEN step_resolve.again THEN NULL ELSE t.now END,
               result = CASE WHEN step_resolve.again THEN NULL ELSE step_resolve.outcome END,
               attempt = CASE WHEN step_resolve.again THEN NULL ELSE s.attempt END,
               lease_token = CASE WHEN step_resolve.again THEN NULL ELSE s.lease_token END,
               intended_at = CASE WHEN step_resolve.again THEN NULL ELSE s.intended_at END,
               resolved_by = step_resolve.actor, resolved_at = t.now,
               resolve_reason = step_resolve.reason
          FROM t, leaseq.jobs j
         WHERE s.job_id = step_resolve.job AND s.name = step_resolve.step AND j.id = s.job_id
           AND j.status::text IN ('held', 'dead') AND s.finished_at IS NULL
           AND s.lease_token IS NOT NULL
        RETURNING s.job_id
    ),
    revived AS (
        UPDATE leaseq.jobs j
           SET status = 'pending', available_at = t.now, finished_at = NULL, lease_owner = NULL,
               max_attempts = j.attempt_count + j.max_attempts
          FROM t, settled
         WHERE j.id = settled.job_id AND j.status::text IN ('held', 'dead')
        RETURNING j.id, j.queue
    ),
    woke AS (SELECT pg_notify('leaseq_jobs', revived.queue) FROM revived)
    SELECT revived.id, (SELECT count(*) FROM woke) FROM revived
$function$
;
