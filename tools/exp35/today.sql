-- T: today's forge.jobs_step, unchanged, behind the prototypes' interface:
-- exp.step(completed ids, their attempts, keep completed?, ids to unlock) -> claimed (id, attempt).
-- (p_unlock is for the advisory-lock variants; ignored here. The caller holds nothing but the
-- jobs it reports: p_held '{}'.)
CREATE FUNCTION exp.step(p_ids bigint[], p_atts integer[], p_keep boolean, p_unlock bigint[])
RETURNS TABLE (id bigint, attempt integer) LANGUAGE sql AS $$
    SELECT s.id, s.attempt
      FROM forge.jobs_step('forge', 'writes', 'default', NULL, NULL, NULL, 1, 1, ARRAY['noop'],
             128, 128, '{}'::bigint[], p_ids, p_atts,
             array_fill('completed'::text, ARRAY[cardinality(p_ids)]),
             array_fill(NULL::bigint, ARRAY[cardinality(p_ids)]),
             array_fill(NULL::jsonb, ARRAY[cardinality(p_ids)]), 25, NULL, NULL, NULL, p_keep,
             '{}') s
     WHERE s.claimed
$$;
