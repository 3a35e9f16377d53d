-- leaseq schema, version 5: a failed attempt keeps its evidence.
--
-- The traceback of the exception that ended the attempt (bounded and redacted like the
-- error, by the worker that ran it), so `leaseq jobs show` still says why after the worker's
-- pod and its stderr are gone. NULL for attempts that did not end in a handler's exception.
-- The worker role's table-wide INSERT on job_attempts (leaseq.apply_grants) covers it.
ALTER TABLE leaseq.job_attempts ADD COLUMN traceback text;
