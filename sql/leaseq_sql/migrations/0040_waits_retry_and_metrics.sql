-- leaseq schema: retrying a job that died waiting starts the wait afresh
-- (docs/concepts/waits.md).
--
-- leaseq.retry_dead (steps.sql, runs as its caller) is now the one statement that revives a
-- dead job: the named statement job_retry_dead (Queue.retry_dead, `leaseq retry`) and
-- leaseq.console_retry_dead (the console's audited retry) both call it. A job that died of
-- WaitTimedOut also has its timed-out wait's deadline withdrawn (the step leaseq.wait-<n>
-- without a .signal outcome) in that statement, so the retried attempt waits again with a
-- new deadline and a signal sent after the retry is received; before, it re-raised at once.
--
-- jobs_signal_wait_idx gains waiting_since: the operator's scrape counts the jobs waiting for
-- a signal per queue and reads the oldest wait's age (leaseq_queue_signal_waiting_jobs,
-- leaseq_queue_oldest_signal_wait_age_seconds) from this small partial index alone.

DROP INDEX leaseq.jobs_signal_wait_idx;
CREATE INDEX jobs_signal_wait_idx ON leaseq.jobs (queue, waiting_since)
    WHERE status = 'pending' AND waiting_for IS NOT NULL;

CREATE OR REPLACE FUNCTION leaseq.console_retry_dead(job_ids bigint[], actor text, reason text, filter jsonb DEFAULT NULL::jsonb)
 RETURNS TABLE(id bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    done bigint[];
    queues text[];
BEGIN
    IF cardinality(job_ids) > 1000 THEN
        RAISE EXCEPTION 'at most 1000 jobs per console action, % given', cardinality(job_ids)
            USING ERRCODE = '22023';
    END IF;
    WITH revived AS (SELECT r.id, r.queue FROM leaseq.retry_dead(job_ids, NULL, NULL) r)
    SELECT coalesce(array_agg(r.id ORDER BY r.id), '{}'), coalesce(array_agg(DISTINCT r.queue), '{}')
      INTO done, queues
      FROM revived r;
    PERFORM pg_notify('leaseq_jobs', q) FROM unnest(queues) q;
    INSERT INTO leaseq.console_audit (actor, action, job_ids, asked, reason, filter)
    VALUES (actor, 'retry_dead', done, coalesce(cardinality(job_ids), 0), reason, filter);
    RETURN QUERY SELECT unnest(done);
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.retry_dead(job_ids bigint[], attempts integer, at timestamp with time zone)
 RETURNS TABLE(id bigint, queue text, max_attempts integer)
 LANGUAGE sql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    WITH t AS (SELECT coalesce(retry_dead.at, now()) AS now),
    revived AS (
        UPDATE leaseq.jobs j
           SET status = 'pending', available_at = t.now, finished_at = NULL, lease_owner = NULL,
               max_attempts = j.attempt_count + coalesce(retry_dead.attempts, j.max_attempts)
          FROM t
         WHERE j.id = ANY(retry_dead.job_ids) AND j.status = 'dead'
        RETURNING j.id, j.queue, j.max_attempts, j.last_error_code
    ),
    withdrawn AS (
        UPDATE leaseq.job_steps s
           SET attempt = NULL, lease_token = NULL, intended_at = NULL, finished_at = NULL,
               result = NULL, note = NULL, resolved_by = 'retry', resolved_at = t.now,
               resolve_reason = 'the wait timed out; retried with a new deadline'
          FROM t, revived r
         WHERE s.job_id = r.id AND r.last_error_code = 'WaitTimedOut'
           AND s.name LIKE 'leaseq.wait-%' AND s.name NOT LIKE '%.signal'
           -- The wait it died at is the last one the handler reached: an earlier wait
           -- whose WaitTimedOut the handler caught keeps its deadline.
           AND s.finished_at = (SELECT max(w.finished_at) FROM leaseq.job_steps w
                                 WHERE w.job_id = s.job_id AND w.name LIKE 'leaseq.wait-%'
                                   AND w.name NOT LIKE '%.signal')
           AND NOT EXISTS (SELECT 1 FROM leaseq.job_steps g
                            WHERE g.job_id = s.job_id AND g.name = s.name || '.signal'
                              AND g.finished_at IS NOT NULL)
        RETURNING s.job_id
    )
    SELECT r.id, r.queue, r.max_attempts FROM revived r
$function$
;
