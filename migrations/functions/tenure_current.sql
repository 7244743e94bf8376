-- The one rule for "this tenure is current" (docs/src/architecture/election.md): the role's row is
-- unreleased and its lock session alive on this server (its pid with the same backend_start; a
-- session of another database user shows no backend_start: counted alive). While that session
-- lives it holds the role's lock, so no other tenure can begin. A crashed leader's tenure stops
-- being current the instant its session ends; a frozen one's when its session is ended - by the
-- server after a lease of silence (idle_session_timeout), or by a follower that saw no renewal
-- for a lease on its own clock (forge.campaign) - and the frozen leader itself has stopped
-- trusting its leadership before either (its deadline is on its own monotonic clock). No wall
-- clock decides it (lease_until, a time on this server's clock, is a report), so a step of that
-- clock fences no healthy leader.
--
-- Everything that asks whether a tenure is current asks this: the fence (forge.fence_holds),
-- the cron gate (forge.tick_gate), placement (forge.placement_move), step-down
-- (forge.step_down) and the read models (a role's leader and `led`, a node's `leads`), so that
-- what operators see is what the fence enforces. The leader's renewal asks something else on
-- purpose, whether the row is still its own (epoch, tenure, its own session).
CREATE OR REPLACE FUNCTION forge.tenure_current(l forge.leaders)
RETURNS boolean
LANGUAGE sql
AS $$
    SELECT l.released_at IS NULL
       AND EXISTS (SELECT 1 FROM pg_stat_get_activity(l.backend_pid) a
                    WHERE a.backend_start IS NULL OR a.backend_start = l.backend_start);
$$;
