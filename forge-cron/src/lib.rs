//! FORGE cron expressions (in progress).
