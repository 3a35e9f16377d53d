-- leaseq schema: a durable sleep tells listening workers when its job wakes (issue 60).
--
-- leaseq.lease_sleep handed a job back with a future run time and told nobody, so the job
-- waited for some idle worker's next poll, whose backoff grows to --poll-seconds: a 1 s
-- sleep woke 2.8 s late (p50). It now sends NOTIFY leaseq_jobs '<queue> <seconds> <job type>'
-- (the seconds from its now to the wake time, in database time), or '<queue>' when the job
-- is claimable at once; a worker's listener arms a timer from it and claims at the wake.
-- Workers of an older version ignore the new payload (it names no queue of theirs). The
-- function keeps its signature, SECURITY DEFINER, pinned search_path and lease checks.

CREATE OR REPLACE FUNCTION leaseq.lease_sleep(job bigint, holder text, token bigint, secret bytea, started timestamp with time zone, until_at timestamp with time zone, at timestamp with time zone)
 RETURNS TABLE(id bigint, status text, available_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
           AND j.lease_token = lease_sleep.token AND j.lease_digest = sha256(lease_sleep.secret || int8send(j.id))
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
$function$
;
