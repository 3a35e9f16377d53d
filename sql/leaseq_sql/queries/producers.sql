-- Named statements for producers that wait for results, loaded once by leaseq.statements.
-- Each block: `-- name: NAME`, one line saying what it does, then the statement.

-- name: waiter_listen
-- Subscribes a dedicated autocommit connection to job completions (payload: the job id), sent for jobs flagged notify_done (leaseq.jobs.notify_done).
LISTEN leaseq_done;

-- name: job_watch
-- Flags each given unfinished job notify_done, so its final transition notifies leaseq_done (run autocommit, after LISTEN and before the read: the row lock orders it against a completion in flight, see migration 0011); jobs already flagged or finished are left alone.
UPDATE leaseq.jobs j
   SET notify_done = true
 WHERE j.id = ANY (%(ids)s::bigint[]) AND j.status NOT IN ('succeeded', 'dead', 'cancelled')
   AND NOT j.notify_done;

-- name: job_outcomes
-- Status, result, last error and attempts of the given jobs (those that exist), for waiters.
SELECT j.id, j.status, j.result, j.last_error, j.last_error_code, j.attempt_count
  FROM leaseq.job_view j
 WHERE j.id = ANY (%(ids)s::bigint[]);
