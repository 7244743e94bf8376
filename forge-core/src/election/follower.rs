//! A campaign between tenures: connecting, waiting inside the lock (or outside it, as a
//! reserve), and what a follower hears and observes of the leader.

use super::observed::{EndHolder, Holder, ObservedLease};
use super::*;

impl Campaign {
    /// Waits outside the lock until the node session's heartbeat finds the role short of
    /// standbys, or the node session comes back after an outage. While the node session is
    /// down (nobody checks), it campaigns again every `lock_timeout`. Keeps the follower's
    /// view of the leader current. False on shutdown.
    pub(super) async fn wait_as_reserve(&mut self, metrics: &RoleMetrics) -> bool {
        self.handle.reserve.store(true, Ordering::Relaxed);
        debug!(target: "forge::leader", role = %self.role(), node = %self.node_id,
               standbys = self.election.standbys, "enough standbys wait inside the lock; waiting outside it");
        let mut deaf_until: Option<Instant> = None;
        let woken = loop {
            tokio::select! {
                _ = self.handle.wake.notified() => break true,
                _ = async { sleep_until(deaf_until.expect("guarded")).await }, if deaf_until.is_some() => break true,
                _ = self.shutdown.cancelled() => break false,
                event = self.events.recv() => match event {
                    Ok(ListenerEvent::Restored) => break true,
                    Ok(ListenerEvent::Lost) => {
                        deaf_until.get_or_insert_with(|| Instant::now() + self.election.lock_timeout);
                    }
                    event => self.follower_event(event, metrics),
                },
            }
        };
        self.handle.reserve.store(false, Ordering::Relaxed);
        woken
    }

    pub(super) fn call_args(&self, wait: bool, end: Option<EndHolder>) -> CallArgs {
        CallArgs {
            namespace: self.namespace.clone(),
            role: self.role().clone(),
            key: self.key,
            node: self.node_id.clone(),
            lease_ms: self.election.lease_duration.as_millis() as i64,
            standbys: self.election.standbys.min(i32::MAX as u32) as i32,
            wait,
            end,
        }
    }

    /// Follows and leads on one lock session until it breaks or the node shuts down.
    pub(super) async fn session(
        &mut self,
        (conn, session_pid): (PgConnection, i32),
        metrics: &RoleMetrics,
    ) -> SessionEnd {
        let mut wait = false;
        // The leader's renewals as this follower saw them, on its own clock.
        let mut observed = ObservedLease::default();
        let lock_timeout = self.election.lock_timeout;
        // A lock wait returns after lock_timeout, by the server's timer: a deadline on the
        // server's wall clock, so a step of that clock can make it late. A call still waiting
        // this long after it was sent is cut short from here (the function takes the cut as a
        // timed-out wait), so that this follower keeps its session and looks at the leader's
        // renewals at its own pace, and a new leader's bump is not held up by a late wait.
        // Much later still, the server or the network is gone.
        let late = lock_timeout + (lock_timeout / 2).max(Duration::from_millis(200));
        let call_bound = lock_timeout + Duration::from_secs(5);
        let mut idle_conn = Some(conn);
        loop {
            let Some(mut conn) = idle_conn.take() else {
                return SessionEnd::Broken;
            };
            let sent_at = Instant::now();
            let end = observed.silent_for(self.election.lease_duration, sent_at);
            let args = self.call_args(wait, end);
            // The call owns the connection and hands it back, so that a shutdown can cancel
            // the wait and still use the session afterwards.
            let call = timeout(call_bound, async move {
                let result = campaign_call(&mut conn, &args).await;
                (conn, result)
            });
            tokio::pin!(call);
            let mut cut = false;
            let outcome = loop {
                tokio::select! {
                    result = &mut call => break result,
                    event = self.events.recv() => self.follower_event(event, metrics),
                    _ = sleep_until(sent_at + late), if !cut => {
                        cut = true;
                        self.cut_late_wait(session_pid).await;
                    }
                    _ = self.shutdown.cancelled() => {
                        return self.stop_waiting(call.as_mut(), session_pid).await;
                    }
                }
            };
            let received_at = Instant::now();
            wait = true;
            let (conn, row) = match outcome {
                Ok((conn, Ok(row))) => (conn, row),
                Ok((mut conn, Err(err))) if is_cancel(&err) => {
                    // A cut (or an operator's cancel) that landed outside a lock wait: the
                    // session is fine. A lock granted before it, without its bump, is given
                    // back (the next waiter takes it); then this follower waits again.
                    match timeout(Duration::from_secs(2), give_back(&mut conn)).await {
                        Ok(Ok(())) => {
                            idle_conn = Some(conn);
                            continue;
                        }
                        _ => {
                            self.session_broken("a cancelled lock wait left the session unusable");
                            return SessionEnd::Broken;
                        }
                    }
                }
                Ok((conn, Err(err))) => {
                    self.session_broken(&err.to_string());
                    close(conn).await;
                    return SessionEnd::Broken;
                }
                Err(_) => {
                    self.session_broken("the lock wait did not return in time");
                    return SessionEnd::Broken;
                }
            };
            if row.my_pid != session_pid {
                let err = Error::TransactionPooler {
                    evidence: format!(
                        "the lock session's backend changed from pid {session_pid} to {}",
                        row.my_pid
                    ),
                };
                error!(target: "forge::leader", role = %self.role(), node = %self.node_id, error = %err, "refusing to lead");
                self.set_state(RoleState::Connecting {
                    last_error: Some(err.to_string()),
                });
                drop(conn);
                return SessionEnd::Broken;
            }
            if row.acquired {
                return self.lead(conn, row, sent_at, metrics).await;
            }
            self.observe_follower(&row, metrics);
            // Once a silent holder was ended, the next call waits for its lock.
            let holder = row
                .fenced_pid
                .is_none()
                .then(|| self.watched_holder(&row))
                .flatten();
            observed.saw(holder, received_at);
            if row.reserve {
                close(conn).await;
                return SessionEnd::Reserve;
            }
            idle_conn = Some(conn);
        }
    }

    /// The holder a not-granted call showed, to watch for silence: an unreleased FORGE leader
    /// of this role holding the lock.
    fn watched_holder(&self, row: &CampaignRow) -> Option<Holder> {
        if row.released != Some(false) || self.foreign_holder(row).is_some() {
            return None;
        }
        row.holder_pid?;
        Some(Holder {
            epoch: row.epoch?,
            tenure: row.tenure?,
            renewed_at: row.renewed_at?,
        })
    }

    /// Cuts short a campaign call's lock wait that outlived lock_timeout by much (the server's
    /// timers run late), if its session waits for a lock: `forge.campaign` takes the cancel as a
    /// timed-out wait.
    async fn cut_late_wait(&self, pid: i32) {
        let cancelled = timeout(
            Duration::from_secs(2),
            sqlx::query_scalar::<_, bool>(
                "SELECT pg_cancel_backend($1)
                  WHERE EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = $1 AND NOT l.granted)",
            )
            .bind(pid)
            .fetch_optional(&self.pool),
        )
        .await;
        if let Ok(Ok(Some(true))) = cancelled {
            info!(target: "forge::leader", role = %self.role(), node = %self.node_id,
                  lock_timeout = ?self.election.lock_timeout,
                  "a lock wait outlived lock_timeout (the server's timers run late: was its clock stepped back?); cut it short");
        }
    }

    pub(super) fn session_broken(&self, why: &str) {
        warn!(target: "forge::leader", role = %self.role(), node = %self.node_id, error = %why, "lock session lost; reconnecting");
        self.set_state(RoleState::Connecting {
            last_error: Some(why.to_owned()),
        });
    }

    /// Shutdown while waiting for the lock: cancel the wait on the server (so that no orphaned
    /// wait can be granted the lock after this node is gone), then close.
    pub(super) async fn stop_waiting<F>(&self, call: Pin<&mut F>, pid: i32) -> SessionEnd
    where
        F: Future<Output = Result<(PgConnection, Result<CampaignRow, sqlx::Error>), Elapsed>>,
    {
        let cancelled = timeout(
            Duration::from_secs(2),
            sqlx::query("SELECT pg_cancel_backend($1)")
                .bind(pid)
                .execute(&self.pool),
        )
        .await;
        if !matches!(cancelled, Ok(Ok(_))) {
            // Dropping the call drops the socket; the backend ends its wait within
            // client_connection_check_interval.
            return SessionEnd::Shutdown;
        }
        // The call now returns: with "canceling statement" normally, or with the lock if it was
        // granted just before the cancel arrived - then hand it straight back.
        if let Ok(Ok((mut conn, result))) = timeout(Duration::from_secs(2), call).await {
            if let Ok(row) = result
                && row.acquired
                && let (Some(epoch), Some(tenure)) = (row.epoch, row.tenure)
            {
                let _ = self.release(&mut conn, Epoch(epoch), tenure, None).await;
            }
            close(conn).await;
        }
        SessionEnd::Shutdown
    }

    pub(super) fn hear(&self, event: Result<ListenerEvent, broadcast::error::RecvError>) -> Heard {
        Heard::from_event(event, self.namespace.name(), self.role().name())
    }

    pub(super) fn follower_event(
        &self,
        event: Result<ListenerEvent, broadcast::error::RecvError>,
        metrics: &RoleMetrics,
    ) {
        if let Heard::Notice(notice) = self.hear(event)
            && let Some(leader) = notice.followed(self.node_id.as_str())
        {
            self.set_state(RoleState::Follower { leader });
            metrics.epoch.set(notice.epoch as f64);
        }
    }

    pub(super) fn observe_follower(&self, row: &CampaignRow, metrics: &RoleMetrics) {
        if let Some(fenced) = row.fenced_pid {
            warn!(target: "forge::leader", role = %self.role(), node = %self.node_id,
                  epoch = row.epoch, leader = row.leader_node.as_deref().unwrap_or("?"), pid = fenced,
                  "ended the session of a leader that stopped renewing (no renewal seen for a lease)");
        }
        if let Some(err) = self.foreign_holder(row) {
            error!(target: "forge::leader", role = %self.role(), node = %self.node_id, error = %err, "cannot campaign");
            metrics.lock_conflicts.increment(1);
            self.set_state(RoleState::Conflict {
                message: err.to_string(),
            });
            return;
        }
        let leader = match (row.epoch, &row.leader_node, row.released) {
            (Some(epoch), Some(node), Some(false)) if row.holder_pid.is_some() => {
                Some(LeaderInfo {
                    node_id: node.clone(),
                    epoch: Epoch(epoch),
                })
            }
            _ => None,
        };
        if let Some(epoch) = row.epoch {
            metrics.epoch.set(epoch as f64);
        }
        self.set_state(RoleState::Follower { leader });
    }

    /// The error to report when the key is held by something other than this role's nodes.
    pub(super) fn foreign_holder(&self, row: &CampaignRow) -> Option<Error> {
        let (pid, application) = (row.holder_pid?, row.holder_application.as_ref()?);
        if application.starts_with(&format!("forge:{}:", self.role())) {
            return None;
        }
        Some(
            match application
                .strip_prefix("forge:")
                .and_then(|rest| rest.split(':').next())
            {
                Some(other) => Error::DuplicateLockKey {
                    first: self.role().name().to_owned(),
                    second: other.to_owned(),
                    key: self.key.0,
                },
                None => Error::LockKeyConflict {
                    role: self.role().name().to_owned(),
                    key: self.key.0,
                    pid,
                    application: application.clone(),
                },
            },
        )
    }
}

/// Whether a statement was cancelled (SQLSTATE 57014, `query_canceled`).
fn is_cancel(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some("57014"))
}

/// Gives back the role's lock if a cancelled campaign call was granted it before the cancel
/// (the lock is the session's; its bump was rolled back). The lock session holds no other.
async fn give_back(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_unlock_all()")
        .execute(conn)
        .await
        .map(drop)
}

impl Heard {
    /// What a LISTEN event means to the campaign of `role` in `namespace`: a notice of its
    /// role, a reason to verify (notifications may have been missed), or nothing.
    fn from_event(
        event: Result<ListenerEvent, broadcast::error::RecvError>,
        namespace: &str,
        role: &str,
    ) -> Heard {
        match event {
            Ok(ListenerEvent::Notification { channel, payload }) if &*channel == LEADER_CHANNEL => {
                match serde_json::from_str::<LeaderNotice>(&payload) {
                    Ok(notice) if notice.namespace == namespace && notice.role == role => {
                        Heard::Notice(notice)
                    }
                    _ => Heard::Nothing,
                }
            }
            Ok(ListenerEvent::Lost) | Err(broadcast::error::RecvError::Lagged(_)) => Heard::Verify,
            _ => Heard::Nothing,
        }
    }
}

impl LeaderNotice {
    /// The follower's state after this notice, heard by node `own`: `Some(leader)` (the
    /// elected node, or `None` for a release or a loss), or `None` when it changes nothing for
    /// a follower - a step-down request, or this node's own election, heard on its node
    /// session before the campaign call's reply on the lock session says so.
    fn followed(&self, own: &str) -> Option<Option<LeaderInfo>> {
        let elected = self.event == "elected";
        if self.event == STEP_DOWN || (elected && self.node.as_deref() == Some(own)) {
            return None;
        }
        Some(
            elected
                .then(|| self.node.clone())
                .flatten()
                .map(|node_id| LeaderInfo {
                    node_id,
                    epoch: Epoch(self.epoch),
                }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(payload: &str) -> Result<ListenerEvent, broadcast::error::RecvError> {
        Ok(ListenerEvent::Notification {
            channel: LEADER_CHANNEL.into(),
            payload: payload.into(),
        })
    }

    fn heard(event: Result<ListenerEvent, broadcast::error::RecvError>) -> Option<LeaderNotice> {
        match Heard::from_event(event, "forge", "scheduler") {
            Heard::Notice(notice) => Some(notice),
            Heard::Verify | Heard::Nothing => None,
        }
    }

    #[test]
    fn a_campaign_hears_its_own_role_and_verifies_after_a_gap() {
        let elected =
            r#"{"namespace":"forge","role":"scheduler","epoch":7,"node":"b","event":"elected"}"#;
        assert_eq!(heard(notice(elected)).unwrap().epoch, 7);
        let other_role = elected.replace("scheduler", "reports");
        assert!(heard(notice(&other_role)).is_none());
        let other_namespace = elected.replace("\"forge\"", "\"other\"");
        assert!(heard(notice(&other_namespace)).is_none());
        assert!(heard(notice("not json")).is_none());
        assert!(matches!(
            Heard::from_event(Ok(ListenerEvent::Lost), "forge", "scheduler"),
            Heard::Verify
        ));
        assert!(matches!(
            Heard::from_event(
                Err(broadcast::error::RecvError::Lagged(3)),
                "forge",
                "scheduler"
            ),
            Heard::Verify
        ));
        assert!(matches!(
            Heard::from_event(Ok(ListenerEvent::Restored), "forge", "scheduler"),
            Heard::Nothing
        ));
    }

    #[test]
    fn a_follower_follows_the_elected_node_but_not_itself() {
        let notice = |event: &str, node: Option<&str>| LeaderNotice {
            namespace: "forge".into(),
            role: "scheduler".into(),
            epoch: 4,
            node: node.map(str::to_owned),
            event: event.into(),
        };
        assert_eq!(
            notice("elected", Some("b")).followed("a"),
            Some(Some(LeaderInfo {
                node_id: "b".into(),
                epoch: Epoch(4)
            }))
        );
        assert_eq!(notice("elected", Some("a")).followed("a"), None);
        assert_eq!(notice(STEP_DOWN, Some("b")).followed("a"), None);
        assert_eq!(notice("released", Some("b")).followed("a"), Some(None));
    }
}
