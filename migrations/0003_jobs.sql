-- FORGE jobs (placeholder: filled in with the job queue).
SELECT 1;
