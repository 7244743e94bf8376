-- The one rule for "this tenure is current" (ARCHITECTURE.md, "The fence"): the role's row is
-- unreleased, its lease unexpired by the database's clock, and its lock session alive on this
-- server (its pid with the same backend_start; a session of another database user shows no
-- backend_start: counted alive). A crashed leader's tenure stops being current the instant its
-- session ends, a frozen one's when its lease runs out.
--
-- Everything that asks whether a tenure is current asks this: the fence (forge.fence_holds),
-- the cron gate (forge.tick_gate), and the read models (a role's leader and `led`, a node's
-- `leads`), so that what operators see is what the fence enforces. The leader's renewal asks
-- something else on purpose, whether the row is still its own (epoch, tenure, its own session):
-- the holder of the lock may renew a lease that ran out by the database's clock (a renewal
-- that landed late), since no one could take the role while it holds the lock; the fence
-- refuses its writes meanwhile.
CREATE OR REPLACE FUNCTION forge.tenure_current(l forge.leaders)
RETURNS boolean
LANGUAGE sql
AS $$
    SELECT l.released_at IS NULL AND l.lease_until > clock_timestamp()
       AND EXISTS (SELECT 1 FROM pg_stat_get_activity(l.backend_pid) a
                    WHERE a.backend_start IS NULL OR a.backend_start = l.backend_start);
$$;
