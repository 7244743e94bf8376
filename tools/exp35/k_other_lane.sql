-- K with a second node's lane naming 512 jobs (its claims ahead): every claim of this lane
-- compares each job it walks with those 512 ids, and they stay unclaimed here.
INSERT INTO exp.lanes SELECT 'other', 'default', ARRAY(SELECT g FROM generate_series(1, 512) g), now();
