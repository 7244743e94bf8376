//! The tenure's batchers: the claims of scheduled ticks, the gate before claimed ticks start
//! and the runs' outcomes, each served by one task that sends whatever is waiting in one
//! statement.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use forge_core::Leadership;
use tokio::sync::{mpsc, oneshot};

use super::super::clock::DbClock;
use super::super::ledger::{Claim, ClaimRequest, Finish, FinishRequest};
use super::gates::GatePassed;

/// A request to one of the tenure's batchers (the claimer, the finisher), and where its
/// answer goes.
pub(super) struct Ask<Q, A> {
    request: Q,
    reply: oneshot::Sender<Result<A, String>>,
}

pub(super) type Claimer = mpsc::UnboundedSender<Ask<ClaimRequest, Claim>>;
/// Answers the gate: the database's time while this tenure is current, `None` otherwise.
pub(super) type Gater = mpsc::UnboundedSender<Ask<DateTime<Utc>, Option<DateTime<Utc>>>>;
pub(super) type Finisher = mpsc::UnboundedSender<Ask<FinishRequest, Finish>>;

/// What the cron loops of one tenure share: its batchers, the gate's latest answer and the
/// database's clock.
#[derive(Clone)]
pub(in crate::cron) struct Batchers {
    /// Claims of scheduled ticks.
    pub(super) claimer: Claimer,
    /// The gate before claimed ticks start.
    pub(super) gater: Gater,
    /// The runs' outcomes.
    pub(super) finisher: Finisher,
    /// The latest time at which a gate found this tenure current.
    pub(super) gate_passed: Arc<GatePassed>,
    /// The database's clock, as this tenure follows it.
    pub(super) clock: Arc<DbClock>,
}

/// Serves asks in batches: whatever is waiting when a batch goes out goes in one statement
/// (with many crons due at one instant, one claim and one outcome statement, one commit
/// each, instead of one per cron). Ends when every sender is gone.
pub(super) async fn batches<Q, A, F, Fut>(
    leadership: Leadership,
    mut asks: mpsc::UnboundedReceiver<Ask<Q, A>>,
    run: F,
) where
    F: Fn(Leadership, Vec<Q>) -> Fut,
    Fut: Future<Output = forge_core::Result<Vec<A>>>,
{
    const MOST: usize = 1000;
    while let Some(first) = asks.recv().await {
        let mut batch = vec![first];
        // The loops of the crons due at this instant woke on the same timer tick: let them
        // run and ask (a few scheduler rounds, no sleep), so that they all go in one batch.
        loop {
            tokio::task::yield_now().await;
            let before = batch.len();
            while batch.len() < MOST {
                match asks.try_recv() {
                    Ok(ask) => batch.push(ask),
                    Err(_) => break,
                }
            }
            if batch.len() == before || batch.len() >= MOST {
                break;
            }
        }
        // Dropped answers are asks whose caller gave up waiting (it asks again: a claim then
        // finds the tick already its own, an outcome the tick already final).
        batch.retain(|ask| !ask.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        let (requests, replies): (Vec<Q>, Vec<_>) = batch
            .into_iter()
            .map(|ask| (ask.request, ask.reply))
            .unzip();
        // Bounded like a single statement: a connection that went silent (half-open) must
        // not hold every later ask of the tenure behind it.
        let answered = tokio::time::timeout(
            leadership.lease_duration(),
            run(leadership.clone(), requests),
        )
        .await;
        match answered {
            Ok(Ok(answers)) => {
                for (reply, answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(Ok(answer));
                }
            }
            failed => {
                let err = match failed {
                    Ok(Err(err)) => err.to_string(),
                    _ => "the batch got no answer in time".to_owned(),
                };
                for reply in replies {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }
}

/// Asks a batcher and waits for its answer.
pub(super) async fn ask<Q, A>(
    batcher: &mpsc::UnboundedSender<Ask<Q, A>>,
    request: Q,
) -> Result<A, String> {
    let (reply, answer) = oneshot::channel();
    batcher
        .send(Ask { request, reply })
        .map_err(|_| "the tenure's batcher has stopped".to_owned())?;
    answer
        .await
        .map_err(|_| "the tenure's batcher has stopped".to_owned())?
}
