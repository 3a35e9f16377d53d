-- Named statements on leaseq.leader_leases: a singleton (the reaper) held with a term.

-- name: leader_acquire
-- Takes or renews the named lease for this holder of this kind (operator, reaper or worker): succeeds if free, expired, or already ours with the same term; a takeover starts a new term. A worker never takes a lease whose last holder was an operator or a leaseq reaper: their rows outlive a release.
INSERT INTO leaseq.leader_leases AS l (name, holder, term, expires_at, holder_kind)
VALUES (%(name)s, %(holder)s, 1, coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(ttl)s), %(kind)s)
ON CONFLICT (name) DO UPDATE
   SET holder = EXCLUDED.holder,
       holder_kind = EXCLUDED.holder_kind,
       term = CASE WHEN l.holder = EXCLUDED.holder AND l.term = %(term)s THEN l.term ELSE l.term + 1 END,
       expires_at = EXCLUDED.expires_at
 WHERE ((l.holder = EXCLUDED.holder AND l.term = %(term)s)
        OR l.expires_at <= coalesce(%(now)s::timestamptz, now()))
   AND (EXCLUDED.holder_kind <> 'worker' OR l.holder_kind = 'worker')
RETURNING l.term, l.expires_at;

-- name: leader_release
-- Gives up the named lease if this holder still has it in this term: the row is kept, lapsed now (so the next acquire takes it over at once, in a new term: terms never restart; an operator's or a leaseq reaper's row keeps telling workers to yield to them).
UPDATE leaseq.leader_leases
   SET expires_at = least(expires_at, now())
 WHERE name = %(name)s AND holder = %(holder)s AND term = %(term)s
RETURNING name;

-- name: leader_holder
-- Who holds or last held the named lease, of which kind, in which term, and whether it is live (a released or lapsed lease is not); no row when no operator or reaper ever held it and no worker holds it.
SELECT holder, holder_kind, term, expires_at,
       expires_at > coalesce(%(now)s::timestamptz, now()) AS live
  FROM leaseq.leader_leases
 WHERE name = %(name)s;

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
