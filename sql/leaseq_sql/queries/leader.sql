-- Named statements on leaseq.leader_leases: a singleton (the reaper) held with a term.

-- name: leader_acquire
-- Takes or renews the named lease for this holder: succeeds if free, expired, or already ours with the same term; a takeover starts a new term.
INSERT INTO leaseq.leader_leases AS l (name, holder, term, expires_at)
VALUES (%(name)s, %(holder)s, 1, coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(ttl)s))
ON CONFLICT (name) DO UPDATE
   SET holder = EXCLUDED.holder,
       term = CASE WHEN l.holder = EXCLUDED.holder AND l.term = %(term)s THEN l.term ELSE l.term + 1 END,
       expires_at = EXCLUDED.expires_at
 WHERE (l.holder = EXCLUDED.holder AND l.term = %(term)s)
    OR l.expires_at <= coalesce(%(now)s::timestamptz, now())
RETURNING l.term, l.expires_at;

-- name: leader_release
-- Gives up the named lease if this holder still has it in this term: the row is kept, lapsed (so the next acquire takes it over at once, in a new term: terms never restart).
UPDATE leaseq.leader_leases
   SET expires_at = '-infinity'
 WHERE name = %(name)s AND holder = %(holder)s AND term = %(term)s
RETURNING name;

-- name: leader_pass_bounds
-- Bounds the reap pass's transaction (milliseconds): a reaper frozen mid-pass (SIGSTOP, a hung node) loses its session, and so the pass lock, instead of holding it forever.
SELECT set_config('idle_in_transaction_session_timeout', %(ms)s::text, true),
       set_config('statement_timeout', %(ms)s::text, true),
       set_config('lock_timeout', %(ms)s::text, true);

-- name: leader_reap_lock
-- Takes the transaction-scoped advisory lock that every reap pass holds, so two reapers never act at once, and says whether this holder's term is still the lease's current, unexpired one (a leader that woke after a takeover must not act).
SELECT pg_try_advisory_xact_lock(hashtextextended('leaseq.reaper', 0)) AS locked,
       EXISTS (SELECT 1 FROM leaseq.leader_leases l
                WHERE l.name = %(name)s AND l.holder = %(holder)s AND l.term = %(term)s
                  AND l.expires_at > coalesce(%(now)s::timestamptz, now())) AS leading;
