-- leaseq's present tense: reading a job's stream from any language.
--
-- Covers: leaseq.stream_read. Granted to the producer role by apply_grants (grants.sql);
-- it runs as its caller, so a producer reads only the streams of the jobs it enqueued.
-- Set off by: Queue.stream (queries/streams.sql, stream_read) and other languages' producers.

-- A job's stream items after offset `after` (at most `lim`, in order) and whether the job has
-- finished (or is gone from the hot table), read in one snapshot: once `finished` is true,
-- every item the job will ever have is at or before the last one returned, so a reader that
-- got fewer than `lim` items has reached the end. Always one row at least: with no items,
-- seq and value are NULL.
CREATE OR REPLACE FUNCTION leaseq.stream_read(job bigint, after bigint DEFAULT 0,
                                              lim integer DEFAULT 1000)
RETURNS TABLE (seq bigint, value jsonb, finished boolean)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH st AS (
        SELECT coalesce((SELECT j.status::text IN ('succeeded', 'dead', 'cancelled')
                           FROM leaseq.jobs j WHERE j.id = stream_read.job), true) AS finished
    )
    SELECT s.seq, s.value, st.finished
      FROM st
      LEFT JOIN LATERAL (
          SELECT i.seq, i.value FROM leaseq.job_stream i
           WHERE i.job_id = stream_read.job AND i.seq > stream_read.after
           ORDER BY i.seq
           LIMIT greatest(stream_read.lim, 1)
      ) s ON true
     ORDER BY s.seq
$$;

REVOKE ALL ON FUNCTION leaseq.stream_read(bigint, bigint, integer) FROM PUBLIC;
