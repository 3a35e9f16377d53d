-- Named statements of job streams (ctx.emit, Queue.stream): an append by the attempt holding
-- the lease, and a read from an offset (leaseq.stream_read, definitions/streams.sql).

-- name: stream_emit
-- Appends %(value)s to the held job's stream as its next item while it has fewer than %(cap)s items; held is false when the lease is not held, seq NULL when the stream is full.
WITH held AS (
    SELECT j.id FROM leaseq.jobs j
     WHERE j.id = %(id)s AND j.lease_owner = %(owner)s AND j.lease_token = %(token)s
       AND j.lease_digest = sha256(%(secret)s::bytea)
       AND j.lease_expires_at > coalesce(%(now)s::timestamptz, now())
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
    SELECT last.id, last.seq + 1, %(value)s, coalesce(%(now)s::timestamptz, now())
      FROM last WHERE last.seq < %(cap)s
    RETURNING seq
)
SELECT EXISTS (SELECT 1 FROM held) AS held, (SELECT seq FROM ins) AS seq;

-- name: stream_read
-- Up to %(limit)s items of a job's stream after offset %(after)s, and whether the job has finished (leaseq.stream_read: one snapshot).
SELECT r.seq, r.value, r.finished FROM leaseq.stream_read(%(id)s, %(after)s, %(limit)s) r;
