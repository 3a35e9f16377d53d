-- Named statements on leaseq.schedules and leaseq.schedule_slots (see leaseq.core.schedules).
-- Time-dependent statements take %(now)s: NULL means database time (always, in production).

-- name: schedule_put
-- Creates a schedule or updates the one of the same origin (leaseq.schedule_put, definitions/schedules.sql); no row when the name belongs to the other origin or another login's code.
SELECT s.schedule AS name, s.created
  FROM leaseq.schedule_put(%(name)s, %(cron)s, %(timezone)s, %(queue)s, %(job_type)s, %(payload)s,
                           %(priority)s, %(max_attempts)s, %(overlap)s, %(catchup_seconds)s,
                           %(declared_by)s, %(declared_in)s,
                           coalesce(%(now)s::timestamptz, now())) s;

-- name: schedule_disable_undeclared
-- Disables (never deletes) the enabled code schedules of an app that its registry no longer declares, of the caller's own login (leaseq.schedule_retire); returns their names.
SELECT leaseq.schedule_retire(%(app)s, %(names)s::text[], coalesce(%(now)s::timestamptz, now())) AS name;

-- name: schedule_set_paused
-- Pauses or resumes a schedule; resuming moves fire_after to now, so slots that fell while paused never fire. No row when there is no such schedule.
UPDATE leaseq.schedules s
   SET paused = %(paused)s,
       fire_after = CASE WHEN s.paused AND NOT %(paused)s
                         THEN coalesce(%(now)s::timestamptz, now()) ELSE s.fire_after END,
       updated_at = CASE WHEN s.paused = %(paused)s THEN s.updated_at
                         ELSE coalesce(%(now)s::timestamptz, now()) END
 WHERE s.name = %(name)s
RETURNING s.name;

-- name: schedule_delete
-- Deletes a schedule; its slot records stay, so adding it again never fires an old slot twice.
DELETE FROM leaseq.schedules WHERE name = %(name)s RETURNING name;

-- name: schedule_list
-- Every schedule (or one) with the state of its last slot's job, the lag of its last firing and the database's now.
SELECT s.name, s.cron, s.timezone, s.queue, s.job_type, s.payload, s.priority, s.max_attempts,
       s.overlap, s.catchup_seconds, s.paused, s.enabled, s.declared_by, s.declared_in,
       s.disabled_reason, s.fire_after, s.last_slot, s.last_job_id, s.missed_slots,
       s.created_at, s.updated_at, j.status AS last_job_status,
       CASE WHEN isfinite(ls.recorded_at) AND isfinite(ls.slot)
            THEN extract(epoch FROM ls.recorded_at - ls.slot)::float8 END AS lag_seconds,
       coalesce(%(now)s::timestamptz, now()) AS now
  FROM leaseq.schedules s
  LEFT JOIN leaseq.jobs j ON j.id = s.last_job_id
  LEFT JOIN leaseq.schedule_slots ls ON ls.name = s.name AND ls.slot = s.last_slot
 WHERE %(name)s::text IS NULL OR s.name = %(name)s
 ORDER BY s.name;

-- name: schedule_due
-- The schedules a tick considers (enabled, not paused), with what it needs to compute their slots and the database's now.
SELECT s.name, s.cron, s.timezone, s.catchup_seconds, s.fire_after, s.last_slot, s.updated_at,
       coalesce(%(now)s::timestamptz, now()) AS now
  FROM leaseq.schedules s
 WHERE s.enabled AND NOT s.paused
 ORDER BY s.name;

-- name: schedule_fire
-- Records one slot and, unless the overlap policy skips it, enqueues its job (in the trace %(trace_context)s, the firing's), in one statement: the (name, slot) key makes a second firing a no-op. No row when the slot was already recorded or the schedule changed since it was read.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
s AS (
    SELECT s.*, (s.overlap = 'skip' AND EXISTS (
               SELECT 1 FROM leaseq.jobs j
                WHERE j.id = s.last_job_id AND j.status IN ('pending', 'running'))) AS busy
      FROM leaseq.schedules s
     WHERE s.name = %(name)s AND s.updated_at = %(version)s AND s.enabled AND NOT s.paused
),
slot AS (
    INSERT INTO leaseq.schedule_slots (name, slot, outcome, job_id, recorded_at)
    SELECT s.name, %(slot)s::timestamptz,
           CASE WHEN s.busy THEN 'skipped' ELSE 'enqueued' END::leaseq.slot_outcome,
           CASE WHEN s.busy THEN NULL
                ELSE nextval(pg_get_serial_sequence('leaseq.jobs', 'id')) END,
           t.now
      FROM s, t
    ON CONFLICT (name, slot) DO NOTHING
    RETURNING name, slot, outcome, job_id
),
job AS (
    INSERT INTO leaseq.jobs (id, queue, job_type, payload, priority, max_attempts, available_at,
                             idempotency_key, created_at, trace_context)
    OVERRIDING SYSTEM VALUE
    SELECT slot.job_id, s.queue, s.job_type, s.payload, s.priority, s.max_attempts, t.now,
           'schedule:' || s.name || ':' || to_char(slot.slot AT TIME ZONE 'UTC',
                                                    'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
           t.now, %(trace_context)s::jsonb
      FROM slot, s, t
     WHERE slot.outcome = 'enqueued'
    RETURNING id, queue
),
mark AS (
    UPDATE leaseq.schedules u
       SET last_slot = greatest(u.last_slot, slot.slot),
           last_job_id = coalesce(slot.job_id, u.last_job_id),
           missed_slots = u.missed_slots + %(missed)s
      FROM slot
     WHERE u.name = slot.name
),
woke AS (SELECT pg_notify('leaseq_jobs', job.queue) FROM job)
SELECT slot.slot, slot.outcome, slot.job_id, (SELECT count(*) FROM woke) AS notified FROM slot;

-- name: pool_due
-- What the given queues have coming after now: the pending jobs due within the horizon (delayed jobs, retries in backoff), counted, and per enabled, unpaused schedule of the queues its cron, zone, job type and last handled slot (no such schedule: one row with NULLs for them); every row carries the database's now.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
delayed AS (
    SELECT count(*) AS delayed
      FROM leaseq.jobs j, t
     WHERE j.status = 'pending' AND j.queue = ANY(%(queues)s::text[]) AND NOT j.ordering_waiting
       AND j.available_at > t.now
       AND j.available_at <= t.now + make_interval(secs => %(horizon)s)
)
SELECT t.now, d.delayed, s.name, s.cron, s.timezone, s.job_type,
       greatest(s.fire_after, s.last_slot) AS handled
  FROM t
 CROSS JOIN delayed d
  LEFT JOIN leaseq.schedules s
         ON s.enabled AND NOT s.paused AND s.queue = ANY(%(queues)s::text[])
 ORDER BY s.name;
