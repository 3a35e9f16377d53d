-- Schedules: periodic jobs, exactly one job per (schedule, slot).
-- The dedup lives in schedule_slots, not in leaseq.jobs, so pruning finished jobs (or moving
-- them to history) never lets a slot fire twice; it has no foreign key to schedules, so a
-- schedule removed and added again under the same name does not fire its old slots again.

CREATE TYPE leaseq.schedule_origin AS ENUM ('code', 'runtime');
CREATE TYPE leaseq.schedule_overlap AS ENUM ('skip', 'allow');
CREATE TYPE leaseq.slot_outcome AS ENUM ('enqueued', 'skipped');

CREATE TABLE leaseq.schedules (
    name             text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 128),
    cron             text NOT NULL,
    timezone         text NOT NULL DEFAULT 'UTC',
    queue            text NOT NULL,
    job_type         text NOT NULL,
    payload          jsonb NOT NULL DEFAULT '{}'::jsonb,
    priority         smallint NOT NULL DEFAULT 100,
    max_attempts     integer NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    overlap          leaseq.schedule_overlap NOT NULL DEFAULT 'skip',
    -- 0: after downtime only the latest missed slot fires; else every slot this recent.
    catchup_seconds  double precision NOT NULL DEFAULT 0 CHECK (catchup_seconds >= 0),
    paused           boolean NOT NULL DEFAULT false,
    enabled          boolean NOT NULL DEFAULT true,
    declared_by      leaseq.schedule_origin NOT NULL,
    -- For code schedules: the app (package.module:registry) that declares it.
    declared_in      text,
    disabled_reason  text,
    -- Slots at or before this instant never fire (set on create, resume, enable, a new cron).
    fire_after       timestamptz NOT NULL DEFAULT now(),
    last_slot        timestamptz,
    last_job_id      bigint,
    missed_slots     bigint NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_disabled_has_reason CHECK (enabled OR disabled_reason IS NOT NULL)
);

CREATE TABLE leaseq.schedule_slots (
    name         text NOT NULL,
    slot         timestamptz NOT NULL,
    outcome      leaseq.slot_outcome NOT NULL,
    job_id       bigint,
    recorded_at  timestamptz NOT NULL,
    PRIMARY KEY (name, slot),
    CONSTRAINT schedule_slots_job CHECK ((outcome = 'enqueued') = (job_id IS NOT NULL))
);
