-- Named statements for producers that wait for results, loaded once by leaseq.statements.
-- Each block: `-- name: NAME`, one line saying what it does, then the statement.

-- name: waiter_listen
-- Subscribes a dedicated autocommit connection to job completions (payload: the job id), sent for jobs flagged notify_done.
LISTEN leaseq_done;

-- name: job_watch
-- Flags the given unfinished jobs so their final transition notifies leaseq_done (see leaseq.watch_jobs); returns how many were flagged.
SELECT leaseq.watch_jobs(%(ids)s::bigint[]) AS flagged;

-- name: job_outcomes
-- Status, result, last error and attempts of the given jobs (those that exist), for waiters.
SELECT j.id, j.status, j.result, j.last_error, j.last_error_code, j.attempt_count
  FROM leaseq.job_view j
 WHERE j.id = ANY (%(ids)s::bigint[]);
