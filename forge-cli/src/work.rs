//! `crons`, `jobs`, `queues`.

use forge::inspect::{Change, CronView, JobFilter, PageRequest, QueueView, TickView};
use forge::jobs::JobAction as Action;
use forge::jobs::{JobId, JobState};
use serde_json::json;

use crate::args::{
    CronsCommand, JobAction, JobFilterArgs, JobsCommand, JobsList, LimitArgs, QueuesCommand,
};
use crate::cluster::print_next;
use crate::ctx::Ctx;
use crate::fail::{Fail, Outcome};
use crate::out::{self, Table};

pub(crate) async fn crons(ctx: &Ctx, action: &CronsCommand, json: bool) -> Outcome {
    let workload = ctx.workload();
    match action {
        CronsCommand::Ls => {
            let crons = workload.crons().await?;
            if json {
                out::print_json(&crons);
            } else if crons.is_empty() {
                outln!("no crons in namespace {}", ctx.namespace);
            } else {
                let mut table = Table::new(&[
                    "NAME",
                    "ROLE",
                    "SCHEDULE",
                    "NEXT",
                    "LAST",
                    "OUTCOME",
                    "LAG",
                    "PAUSED",
                    "MISSED 24H",
                ]);
                for cron in &crons {
                    table.row(cron_row(cron));
                }
                table.print();
            }
            Ok(0)
        }
        CronsCommand::Show {
            name,
            limit,
            before,
        } => {
            let cron = known_cron(ctx, workload.cron(name).await?, name)?;
            let ticks = workload
                .ticks(
                    name,
                    PageRequest {
                        limit: *limit,
                        before: *before,
                    },
                )
                .await?;
            if json {
                out::print_json(&json!({ "cron": cron, "ticks": ticks }));
                return Ok(0);
            }
            out::print_fields(&[
                ("cron", cron.name.clone()),
                ("role", cron.role.clone()),
                (
                    "schedule",
                    format!("{} ({})", cron.expression, cron.timezone),
                ),
                ("next run", out::opt_time(cron.next_run)),
                (
                    "paused",
                    match (&cron.paused_at, &cron.paused_by) {
                        (Some(at), by) => {
                            format!(
                                "since {} by {}",
                                out::time(*at),
                                out::or_dash(by.as_deref())
                            )
                        }
                        (None, _) => "no".to_owned(),
                    },
                ),
                ("skipped 24h", cron.skipped_24h.to_string()),
                ("missing 24h", cron.missing_24h.to_string()),
                ("last seen by", cron.last_seen_by.clone()),
            ]);
            outln!();
            if ticks.items.is_empty() {
                outln!("no ticks yet");
            } else {
                let mut table = Table::new(&[
                    "SCHEDULED",
                    "STATE",
                    "ATTEMPT",
                    "NODE",
                    "EPOCH",
                    "LAG",
                    "DURATION",
                    "FINISHED",
                    "ERROR",
                ]);
                for tick in &ticks.items {
                    table.row(tick_row(tick));
                }
                table.print();
                print_next(ticks.next);
            }
            Ok(0)
        }
        CronsCommand::Pause { name } | CronsCommand::Resume { name } => {
            let pause = matches!(action, CronsCommand::Pause { .. });
            let known = if pause {
                workload.pause_cron(name, &ctx.by).await?
            } else {
                workload.resume_cron(name, &ctx.by).await?
            };
            if !known {
                return Err(no_cron(ctx, name));
            }
            let verb = if pause { "paused" } else { "resumed" };
            if json {
                out::print_json(&json!({ "cron": name, "paused": pause }));
            } else {
                outln!("{verb} cron {name}");
            }
            Ok(0)
        }
        CronsCommand::Trigger { name } => {
            let Some(at) = workload.trigger_cron(name, &ctx.by).await? else {
                return Err(no_cron(ctx, name));
            };
            if json {
                out::print_json(&json!({ "cron": name, "scheduled_at": at }));
            } else {
                outln!(
                    "triggered cron {name}: the leader of its role runs it as the tick of {}",
                    out::time(at)
                );
            }
            Ok(0)
        }
        CronsCommand::Add(cron) => crate::stored::store(ctx, cron, true, json).await,
        CronsCommand::Set(cron) => crate::stored::store(ctx, cron, false, json).await,
        CronsCommand::Delete { name } => crate::stored::delete(ctx, name, json).await,
    }
}

fn known_cron(ctx: &Ctx, cron: Option<CronView>, name: &str) -> Result<CronView, Fail> {
    cron.ok_or_else(|| no_cron(ctx, name))
}

fn no_cron(ctx: &Ctx, name: &str) -> Fail {
    Fail::problem(format!(
        "no cron {name:?} in namespace {}: crons are known once a node that has them started (see `forge crons ls`)",
        ctx.namespace
    ))
}

fn cron_row(cron: &CronView) -> Vec<String> {
    vec![
        cron.name.clone(),
        cron.role.clone(),
        if cron.timezone == "UTC" {
            cron.expression.clone()
        } else {
            format!("{} {}", cron.expression, cron.timezone)
        },
        out::opt_time(cron.next_run),
        out::opt_time(cron.last.as_ref().map(|t| t.scheduled_at)),
        cron.last
            .as_ref()
            .map_or_else(|| "-".to_owned(), |t| t.state.as_str().to_owned()),
        cron.last
            .as_ref()
            .and_then(|t| t.lag_ms)
            .map_or_else(|| "-".to_owned(), out::ms),
        if cron.paused_at.is_some() {
            "yes"
        } else {
            "no"
        }
        .to_owned(),
        cron.missing_24h.to_string(),
    ]
}

fn tick_row(tick: &TickView) -> Vec<String> {
    vec![
        out::time(tick.scheduled_at),
        tick.state.as_str().to_owned(),
        tick.attempt.to_string(),
        tick.node_id.clone(),
        tick.epoch.to_string(),
        tick.lag_ms.map_or_else(|| "-".to_owned(), out::ms),
        tick.duration_ms.map_or_else(|| "-".to_owned(), out::ms),
        out::opt_time(tick.finished_at),
        out::cut(tick.error.as_deref().unwrap_or(""), 60),
    ]
}

/// The filter the flags describe, or what is wrong with them.
pub(crate) fn job_filter(args: &JobFilterArgs) -> Result<JobFilter, Fail> {
    let states = args
        .states
        .iter()
        .map(|state| {
            JobState::parse(state).ok_or_else(|| {
                Fail::usage(format!(
                    "unknown job state {state:?}; states: {}",
                    JobState::ALL
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let json_args = args
        .args
        .as_deref()
        .map(|text| {
            serde_json::from_str::<serde_json::Value>(text).map_err(|err| {
                Fail::usage(format!(
                    "--args {text:?} is not valid JSON ({err}); give the JSON the arguments should contain, e.g. --args '{{\"user_id\": 7}}'"
                ))
            })
        })
        .transpose()?;
    let filter = JobFilter {
        states,
        queue: args.queue.clone(),
        kind: args.kind.clone(),
        args: json_args,
    };
    Ok(filter)
}

/// `forge jobs ls` (or `forge jobs` with filters alone): a page of jobs.
pub(crate) async fn jobs_list(ctx: &Ctx, list: &JobsList, json: bool) -> Outcome {
    let JobsList {
        filter,
        limit,
        before,
    } = list;
    let filter = job_filter(filter)?;
    let page = ctx
        .workload()
        .jobs(
            &filter,
            PageRequest {
                limit: *limit,
                before: *before,
            },
        )
        .await?;
    if json {
        out::print_json(&json!({
            "items": page.items,
            "next": page.next,
        }));
        return Ok(0);
    }
    if page.items.is_empty() {
        outln!("no jobs match");
        return Ok(0);
    }
    let mut table = Table::new(&[
        "ID", "QUEUE", "KIND", "STATE", "ATTEMPT", "RUN AT", "NODE", "ARGS",
    ]);
    for job in &page.items {
        table.row(vec![
            job.id.to_string(),
            job.queue.clone(),
            job.kind.clone(),
            job.state.as_str().to_owned(),
            match job.max_attempts {
                Some(max) => format!("{}/{max}", job.attempt),
                None => job.attempt.to_string(),
            },
            out::time(job.run_at),
            out::or_dash(job.node_id.as_deref()),
            out::cut(&job.args.to_string(), 60),
        ]);
    }
    table.print();
    print_next(page.next);
    Ok(0)
}

pub(crate) async fn jobs(ctx: &Ctx, action: &JobsCommand, json: bool) -> Outcome {
    let workload = ctx.workload();
    match action {
        JobsCommand::Ls(list) => jobs_list(ctx, list, json).await,
        JobsCommand::Show { id } => {
            let Some(job) = workload.job(JobId(*id)).await? else {
                return Err(no_job(ctx, *id));
            };
            if json {
                out::print_json(&serde_json::json!(job));
                return Ok(0);
            }
            out::print_fields(&[
                ("job", job.id.to_string()),
                ("kind", job.kind.clone()),
                ("queue", job.queue.clone()),
                ("state", job.state.as_str().to_owned()),
                (
                    "attempt",
                    match job.max_attempts {
                        Some(max) => format!("{} of {max}", job.attempt),
                        None => format!("{} (of [jobs] default_max_attempts)", job.attempt),
                    },
                ),
                (
                    "snoozes",
                    out::or_dash(
                        (job.snoozes > 0)
                            .then(|| format!("{} (each gave its attempt back)", job.snoozes)),
                    ),
                ),
                ("priority", job.priority.to_string()),
                ("run at", out::time(job.run_at)),
                ("created", out::time(job.created_at)),
                ("attempted", out::opt_time(job.attempted_at)),
                ("finished", out::opt_time(job.finished_at)),
                ("node", out::or_dash(job.node_id.as_deref())),
                ("role", out::or_dash(job.role.as_deref())),
                ("unique key", out::or_dash(job.unique_key.as_deref())),
                (
                    "timeout",
                    out::or_dash(
                        job.timeout
                            .map(|t| humantime::format_duration(t).to_string()),
                    ),
                ),
                (
                    "cancel",
                    if job.cancel_requested {
                        "requested"
                    } else {
                        "-"
                    }
                    .to_owned(),
                ),
                ("args", job.args.to_string()),
                (
                    "output",
                    out::or_dash(job.output.as_ref().map(|o| out::cut(&o.to_string(), 2000))),
                ),
                ("parents", parents_line(&job)),
                ("children", out::or_dash(id_list(&job.children))),
                (
                    "actions",
                    out::or_dash(
                        Some(
                            Action::ALL
                                .iter()
                                .filter(|a| job.actions.allows(**a))
                                .map(|a| a.as_str())
                                .collect::<Vec<_>>()
                                .join(", "),
                        )
                        .filter(|list| !list.is_empty()),
                    ),
                ),
            ]);
            if !job.errors.is_empty() {
                outln!();
                let mut table = Table::new(&["ATTEMPT", "AT", "NODE", "REASON", "ERROR"]);
                for err in &job.errors {
                    table.row(vec![
                        err.attempt.to_string(),
                        out::time(err.at),
                        out::or_dash(err.node.as_deref()),
                        err.reason.clone(),
                        out::cut(&err.error, 200),
                    ]);
                }
                table.print();
            }
            Ok(0)
        }
        JobsCommand::Retry(act) => job_action(ctx, act, Action::Retry, json).await,
        JobsCommand::Cancel(act) => job_action(ctx, act, Action::Cancel, json).await,
        JobsCommand::Delete(act) => job_action(ctx, act, Action::Delete, json).await,
        JobsCommand::Limit(args) => crate::kind_limits::limit(ctx, args, json).await,
        JobsCommand::Limits => crate::kind_limits::list(ctx, json).await,
    }
}

/// A job's parents, with how many have not ended yet.
fn parents_line(job: &forge::jobs::JobInfo) -> String {
    match (id_list(&job.parents), job.parents_left) {
        (Some(ids), Some(left)) if left > 0 => format!("{ids} ({left} not ended yet)"),
        (Some(ids), _) => ids,
        (None, _) => "-".to_owned(),
    }
}

/// Job ids, comma-separated (`None`: none).
fn id_list(ids: &[JobId]) -> Option<String> {
    (!ids.is_empty()).then(|| {
        ids.iter()
            .map(|id| id.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// What an action did, for the output.
fn done(action: Action) -> &'static str {
    match action {
        Action::Retry => "made available again",
        Action::Cancel => "cancelled (or asked to stop)",
        Action::Delete => "deleted",
    }
}

async fn job_action(ctx: &Ctx, act: &JobAction, verb: Action, json: bool) -> Outcome {
    let workload = ctx.workload();
    let Some(id) = act.id else {
        // Bulk: only with --all-matching and at least one filter.
        if act.filter.is_empty() {
            return Err(Fail::usage(format!(
                "`jobs {} --all-matching` needs at least one filter (--state, --queue, --kind, --args): \
                 list them first with `forge jobs ls` and the same filters",
                verb.as_str()
            )));
        }
        let filter = job_filter(&act.filter)?;
        let n = match verb {
            Action::Retry => workload.retry_jobs(&filter, &ctx.by).await?,
            Action::Cancel => workload.cancel_jobs(&filter, &ctx.by).await?,
            Action::Delete => workload.delete_jobs(&filter, &ctx.by).await?,
        };
        if json {
            out::print_json(&json!({ "action": verb.as_str(), "matched": n }));
        } else {
            outln!("{n} jobs {}", done(verb));
        }
        return Ok(0);
    };
    if !act.filter.is_empty() {
        return Err(Fail::usage(format!(
            "filters select jobs for `jobs {} --all-matching`; with a job id, give no filter",
            verb.as_str()
        )));
    }
    let job = JobId(id);
    let change = match verb {
        Action::Retry => workload.retry_job(job, &ctx.by).await?,
        Action::Cancel => workload.cancel_job(job, &ctx.by).await?,
        Action::Delete => workload.delete_job(job, &ctx.by).await?,
    };
    match change {
        Change::Applied => {
            if json {
                out::print_json(
                    &json!({ "action": verb.as_str(), "id": id, "outcome": "applied" }),
                );
            } else {
                outln!("job {id} {}", done(verb));
            }
            Ok(0)
        }
        Change::NotFound => Err(no_job(ctx, id)),
        Change::Refused(why) => Err(Fail::problem(format!(
            "cannot {} job {id}: {why}",
            verb.as_str()
        ))),
        other => Err(Fail::problem(format!(
            "job {id}: unexpected outcome {other:?}"
        ))),
    }
}

fn no_job(ctx: &Ctx, id: i64) -> Fail {
    Fail::problem(format!(
        "no job {id} in namespace {} (finished jobs are pruned after their retention): see `forge jobs ls`",
        ctx.namespace
    ))
}

pub(crate) async fn queues(ctx: &Ctx, action: &QueuesCommand, json: bool) -> Outcome {
    let workload = ctx.workload();
    match action {
        QueuesCommand::Ls => {
            let queues = workload.queues().await?;
            if json {
                out::print_json(&queues);
            } else if queues.is_empty() {
                outln!("no queues with jobs in namespace {}", ctx.namespace);
            } else {
                let mut table = Table::new(&[
                    "QUEUE",
                    "AVAILABLE",
                    "SCHEDULED",
                    "PENDING",
                    "RUNNING",
                    "RETRYABLE",
                    "DEAD",
                    "OLDEST",
                    "LIMITS",
                    "WAITING ON",
                    "PAUSED",
                ]);
                for q in &queues {
                    table.row(queue_row(q));
                }
                table.print();
            }
            Ok(0)
        }
        QueuesCommand::Pause { queue, new } => {
            let Some(was_paused) = workload.pause_queue(queue, &ctx.by, *new).await? else {
                return Err(unknown_queue(ctx, queue, true));
            };
            if json {
                out::print_json(
                    &json!({ "queue": queue, "paused": true, "was_paused": was_paused }),
                );
            } else if was_paused {
                outln!("queue {queue} was paused already");
            } else {
                outln!("paused queue {queue}: no node claims its jobs until it is resumed");
            }
            Ok(0)
        }
        QueuesCommand::Limit(args) => limit(ctx, args, json).await,
        QueuesCommand::Resume { queue } => {
            let Some(was_paused) = workload.resume_queue(queue, &ctx.by).await? else {
                return Err(unknown_queue(ctx, queue, false));
            };
            if json {
                out::print_json(
                    &json!({ "queue": queue, "paused": false, "was_paused": was_paused }),
                );
            } else if was_paused {
                outln!("resumed queue {queue}");
            } else {
                outln!("queue {queue} was not paused");
            }
            Ok(0)
        }
    }
}

/// `forge queues limit`: sets, removes or resets a queue's limits.
async fn limit(ctx: &Ctx, args: &LimitArgs, json: bool) -> Outcome {
    let workload = ctx.workload();
    let queue = &args.queue;
    let Some(limits) = args.values.limits()? else {
        let Some(had) = workload.reset_queue_limits(queue, &ctx.by).await? else {
            return Err(unknown_queue(ctx, queue, false));
        };
        if json {
            out::print_json(&json!({ "queue": queue, "reset": true, "had_operator_limits": had }));
        } else {
            outln!(
                "queue {queue}: limits given back to forge.toml (unlimited until a node starts and writes them){}",
                if had {
                    ""
                } else {
                    "; no operator had set them"
                }
            );
        }
        return Ok(0);
    };
    if workload
        .set_queue_limits(queue, &limits, &ctx.by, args.new)
        .await?
        .is_none()
    {
        return Err(unknown_queue(ctx, queue, false));
    }
    if json {
        out::print_json(&json!({ "queue": queue, "limits": limits }));
    } else {
        outln!("queue {queue}: {limits}, from the next claim on every node");
    }
    Ok(0)
}

fn unknown_queue(ctx: &Ctx, queue: &str, pausing: bool) -> Fail {
    Fail::problem(format!(
        "no queue {queue:?} in namespace {} (no node works it, it holds no unfinished or dead job, it is not paused): see `forge queues`{}",
        ctx.namespace,
        if pausing {
            "; to pause a queue before any node works it, pass --new"
        } else {
            ""
        }
    ))
}

fn queue_row(q: &QueueView) -> Vec<String> {
    vec![
        q.queue.clone(),
        q.available.to_string(),
        q.scheduled.to_string(),
        q.pending.to_string(),
        q.running.to_string(),
        q.retryable.to_string(),
        q.dead.to_string(),
        if q.available > 0 {
            out::secs(q.oldest_available_age_s)
        } else {
            "-".to_owned()
        },
        match (q.limits.is_empty(), &q.limits_set_by) {
            (true, _) => "-".to_owned(),
            (false, None) => q.limits.to_string(),
            (false, Some(by)) => format!("{} (by {by})", q.limits),
        },
        q.waiting_on.clone().unwrap_or_else(|| "-".to_owned()),
        if q.paused { "yes" } else { "no" }.to_owned(),
    ]
}
