-- Named statements of job streams (ctx.emit, Queue.stream): an append by the attempt holding
-- the lease (leaseq.lease_emit, definitions/lease.sql), and a read from an offset
-- (leaseq.stream_read, definitions/streams.sql).

-- name: stream_emit
-- Appends %(value)s to the held job's stream as its next item while it has fewer than %(cap)s items (leaseq.lease_emit); held is false when the lease is not held, seq NULL when the stream is full.
SELECT e.held, e.seq
  FROM leaseq.lease_emit(%(id)s, %(owner)s, %(token)s, %(secret)s, %(value)s::jsonb, %(cap)s,
                         %(now)s::timestamptz) e;

-- name: stream_read
-- Up to %(limit)s items of a job's stream after offset %(after)s, and whether the job has finished (leaseq.stream_read: one snapshot).
SELECT r.seq, r.value, r.finished FROM leaseq.stream_read(%(id)s, %(after)s, %(limit)s) r;
