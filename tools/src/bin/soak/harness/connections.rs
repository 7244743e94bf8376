//! Connections full while one node's node session is cut.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use sqlx::Connection as _;
use tokio::time::Instant;

use super::{ConnFill, FillStage, FillState, Harness, Phase, as_node_role};
use crate::{DOWN_AFTER, MAX_CONNECTIONS, NODE_ROLE};

impl Harness {
    pub(super) async fn start_fill(&mut self) -> Option<String> {
        let (i, note) = self.pick_node(true).await?;
        let url = format!(
            "{}?application_name=forge-soak-filler",
            as_node_role(&self.primary.url_for(&self.db_name)).ok()?
        );
        let state = Arc::new(std::sync::Mutex::new(FillState::default()));
        let task = tokio::spawn(fill_connections(url, state.clone()));
        let hold = DOWN_AFTER + self.rng.secs(2.0, 5.0);
        self.fill = Some(ConnFill {
            slot: i,
            state,
            task,
            hold,
            stage: FillStage::Filling {
                deadline: Instant::now() + Duration::from_secs(20),
            },
        });
        Some(format!(
            "connections full: the harness opens connections as {NODE_ROLE} until max_connections ({MAX_CONNECTIONS}, less the superuser-reserved ones), then ends {}{note}'s node session; it cannot reconnect for {:.1} s (down_after {} s)",
            self.slots[i].id,
            hold.as_secs_f64(),
            DOWN_AFTER.as_secs()
        ))
    }

    /// Ends slot `i`'s node session; the filler then takes the freed slot.
    async fn cut_node_session(&self, i: usize) -> i64 {
        if let Some(fill) = &self.fill {
            fill.state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .spin_until = Some(Instant::now() + Duration::from_millis(1500));
        }
        self.count(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
              WHERE application_name = $1",
            &format!("forge:node:{}", self.slots[i].id),
        )
        .await
        .unwrap_or(0)
    }

    pub(super) async fn tend_fill(&mut self) {
        let Some(fill) = &self.fill else {
            return;
        };
        let i = fill.slot;
        let id = self.slots[i].id.clone();
        let now = Instant::now();
        let (held, refused, full, errors, last_error) = {
            let state = fill.state.lock().unwrap_or_else(|e| e.into_inner());
            (
                state.held,
                state.refused,
                state.full,
                state.errors,
                state.last_error.clone(),
            )
        };
        match fill.stage {
            FillStage::Filling { deadline } => {
                if full {
                    let hold = fill.hold;
                    // Work only this node does (its hog queue), due through the fault: its
                    // workers must go on claiming and running it without a node session.
                    let mut hogs = vec![(Duration::ZERO, Duration::from_secs(3))];
                    let mut at = Duration::from_millis(500);
                    while at < hold {
                        hogs.push((at, Duration::from_millis(300)));
                        at += Duration::from_secs(1);
                    }
                    let enqueued = self.enqueue_hogs(i, &hogs).await;
                    let cut = self.cut_node_session(i).await;
                    if let Some(fill) = &mut self.fill {
                        fill.stage = FillStage::Holding {
                            since: now,
                            since_us: Utc::now().timestamp_micros(),
                            until: now + hold,
                            next_check: now + Duration::from_millis(300),
                            terminations: 1,
                        };
                    }
                    self.note(format!(
                        "connections full ({held} held by the harness); {} jobs only {id} works enqueued (one now for 3 s, then one due every second); {id}'s node session ended ({cut} terminated)",
                        if enqueued { hogs.len() } else { 0 }
                    ));
                } else if now >= deadline {
                    self.stop_fill().await;
                    self.note(format!(
                        "connections full: the server was not full within 20 s ({held} held, {errors} errors: {last_error}); given up"
                    ));
                }
            }
            FillStage::Holding {
                since,
                since_us,
                until,
                next_check,
                terminations,
            } => {
                if now >= until {
                    self.stop_fill().await;
                    self.scan_current(i);
                    let now_us = Utc::now().timestamp_micros();
                    let within = |us: i64| us >= since_us && us <= now_us;
                    let started = self
                        .spans
                        .iter()
                        .filter(|s| s.slot == i && within(s.start_us))
                        .count();
                    let ended = self
                        .spans
                        .iter()
                        .filter(|s| s.slot == i && s.end_us.is_some_and(within))
                        .count();
                    let alive = matches!(self.slots[i].phase, Phase::Running { .. });
                    let ok = started + ended > 0;
                    let text = format!(
                        "{id} could not reconnect for {:.1} s ({held} connections held by the harness, {refused} connection attempts refused, its node session ended {terminations} time(s)): meanwhile its handlers started {started} and finished {ended} jobs; the process is {}",
                        since.elapsed().as_secs_f64(),
                        if alive { "running" } else { "NOT running" }
                    );
                    self.note(format!("connections freed. {text}"));
                    self.fill_reports.push((ok, text));
                } else if now >= next_check {
                    let back = self
                        .count(
                            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                            &format!("forge:node:{id}"),
                        )
                        .await
                        .unwrap_or(0);
                    let mut terminations = terminations;
                    if back > 0 && terminations < 20 {
                        let cut = self.cut_node_session(i).await;
                        terminations += 1;
                        self.note(format!(
                            "{id} got a connection slot back for its node session; ended again ({cut} terminated)"
                        ));
                    }
                    if let Some(fill) = &mut self.fill {
                        fill.stage = FillStage::Holding {
                            since,
                            since_us,
                            until,
                            next_check: now + Duration::from_millis(300),
                            terminations,
                        };
                    }
                }
            }
        }
    }

    /// Stops the filling task, which closes its connections.
    pub(super) async fn stop_fill(&mut self) {
        if let Some(fill) = self.fill.take() {
            fill.state.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
            let _ = tokio::time::timeout(Duration::from_secs(10), fill.task).await;
        }
    }
}

/// The connections-full fault's task: opens connections as the nodes' role until the server
/// refuses them (too many connections), keeps them, and keeps taking every slot that frees
/// (every few ms while `spin_until`, else every 50 ms) until told to stop.
pub(super) async fn fill_connections(url: String, state: Arc<std::sync::Mutex<FillState>>) {
    let mut conns = Vec::new();
    loop {
        let (stop, spin) = {
            let state = state.lock().unwrap_or_else(|e| e.into_inner());
            (
                state.stop,
                state.spin_until.is_some_and(|t| Instant::now() < t),
            )
        };
        if stop {
            break;
        }
        let attempt =
            tokio::time::timeout(Duration::from_secs(2), sqlx::PgConnection::connect(&url)).await;
        {
            let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
            match attempt {
                Ok(Ok(conn)) => {
                    conns.push(conn);
                    state.held = conns.len();
                    continue;
                }
                Ok(Err(sqlx::Error::Database(err))) if err.code().as_deref() == Some("53300") => {
                    state.full = true;
                    state.refused += 1;
                }
                Ok(Err(err)) => {
                    state.errors += 1;
                    state.last_error = err.to_string();
                }
                Err(_) => {
                    state.errors += 1;
                    state.last_error = "connect timed out".to_owned();
                }
            }
        }
        tokio::time::sleep(if spin {
            Duration::from_millis(3)
        } else {
            Duration::from_millis(50)
        })
        .await;
    }
    for conn in conns {
        let _ = conn.close().await;
    }
    state.lock().unwrap_or_else(|e| e.into_inner()).held = 0;
}
