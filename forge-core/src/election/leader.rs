//! A tenure: beginning it, holding it (renewals, notices, the deadline), and its end - lost,
//! or handed over after a drain - with the typed reason.

use super::*;

/// How holding a leadership ended.
enum Hold {
    /// The node shuts down: hand over.
    Shutdown,
    /// An operator asked this leader to step down: hand over, keep campaigning.
    StepDown,
    /// Placement asked this leader to hand the role over to another node: hand over to it,
    /// keep campaigning.
    Move(PlacementMove),
    /// Lost, for this reason.
    Lost(LossReason),
}

/// Why a tenure ended: the `reason` label of `forge_leader_losses_total` (every one exported
/// at 0 from the start), the reason of the `leader_lost` event and of the log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LossReason {
    /// Its local deadline passed before a renewal landed.
    Deadline,
    /// A renewal found the lease no longer its own, or a newer epoch was announced.
    Deposed,
    /// A renewal failed (the lock session's error).
    RenewalFailed,
    /// Handed over: the node shuts down.
    Shutdown,
    /// Handed over: an operator asked a step-down.
    StepDown,
    /// Handed over: placement moved the role to another node.
    Rebalance,
}

impl LossReason {
    /// Every reason, as exported at 0.
    pub(crate) const ALL: [LossReason; 6] = [
        LossReason::Deadline,
        LossReason::Deposed,
        LossReason::RenewalFailed,
        LossReason::Shutdown,
        LossReason::StepDown,
        LossReason::Rebalance,
    ];

    /// The reason as metrics, events and logs name it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LossReason::Deadline => "deadline",
            LossReason::Deposed => "deposed",
            LossReason::RenewalFailed => "renewal_failed",
            LossReason::Shutdown => "shutdown",
            LossReason::StepDown => "step_down",
            LossReason::Rebalance => "rebalance",
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Campaign {
    /// Leads until the leadership is lost or handed over.
    pub(super) async fn lead(
        &mut self,
        mut conn: PgConnection,
        row: CampaignRow,
        sent_at: Instant,
        metrics: &RoleMetrics,
    ) -> SessionEnd {
        let epoch = Epoch(row.epoch.unwrap_or_default());
        let sent_at = match self.confirm_fresh_lease(&mut conn, &row, sent_at).await {
            Ok(sent_at) => sent_at,
            Err(why) => {
                self.session_broken(&why);
                close(conn).await;
                return SessionEnd::Broken;
            }
        };
        let session: SharedSession = Arc::new(tokio::sync::Mutex::new(Some(conn)));
        let leadership = self.begin_tenure(&row, sent_at, metrics, session.clone());
        // What only this tenure exported (a leader's figures) goes with it.
        let tenure_metrics = leadership.metrics().clone();
        let mut tasks = self.start_tasks(&leadership);
        let end = match self.hold(&session, &leadership, metrics).await {
            Hold::Shutdown => {
                self.hand_over(&session, leadership, tasks, metrics, None)
                    .await
            }
            Hold::StepDown => {
                self.hand_over(&session, leadership, tasks, metrics, Some(None))
                    .await;
                SessionEnd::SteppedDown
            }
            Hold::Move(to) => {
                self.hand_over(&session, leadership, tasks, metrics, Some(Some(to)))
                    .await;
                SessionEnd::SteppedDown
            }
            Hold::Lost(reason) => {
                // Stop leader-only work before anything else.
                leadership.tenure().lost.cancel();
                self.handle.set_current(None);
                metrics.lost(reason);
                warn!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0, reason = reason.as_str(), "lost leadership");
                self.set_state(RoleState::Connecting {
                    last_error: Some(format!("lost leadership of epoch {epoch}: {reason}")),
                });
                stop_tasks(&mut tasks).await;
                self.record_loss(epoch, leadership.tenure_id(), reason);
                // Closing the session releases the lock if this node still holds it.
                match take_session(&session).await {
                    Some(conn) if reason != LossReason::Deadline => close(conn).await,
                    _ => {}
                }
                SessionEnd::Broken
            }
        };
        tenure_metrics.close_scope();
        end
    }

    /// Records `leader_lost` in the events history, in the background and best effort (the
    /// database may be what took the leadership away; the successor's `leader_elected` with
    /// `failover` tells the same story from the other side).
    pub(super) fn record_loss(&self, epoch: Epoch, tenure: i64, reason: LossReason) {
        let pool = self.pool.clone();
        let (namespace, role, node) = (
            self.namespace.clone(),
            self.role().clone(),
            self.node_id.clone(),
        );
        tokio::spawn(async move {
            let recorded = timeout(
                Duration::from_secs(30),
                sqlx::query("SELECT forge.leader_lost($1, $2, $3, $4, $5, $6)")
                    .bind(&namespace)
                    .bind(&role)
                    .bind(&node)
                    .bind(epoch)
                    .bind(tenure)
                    .bind(reason.as_str())
                    .execute(&pool),
            )
            .await;
            if !matches!(recorded, Ok(Ok(_))) {
                debug!(target: "forge::leader", role = %role, epoch = epoch.0, "could not record the lost leadership in the events history");
            }
        });
    }

    /// Trust is measured from when the campaign call was sent, and the call may have waited in
    /// the lock for up to lock_timeout. If that leaves less than one refresh interval of trust,
    /// confirm the lease first (one round trip) rather than start work on a leadership about
    /// to expire locally. Returns the send time trust is measured from.
    pub(super) async fn confirm_fresh_lease(
        &self,
        conn: &mut PgConnection,
        row: &CampaignRow,
        sent_at: Instant,
    ) -> std::result::Result<Instant, String> {
        let lease = self.election.lease_duration;
        let margin = self.election.safety_margin();
        if Instant::now() + self.election.refresh_interval < sent_at + lease - margin {
            return Ok(sent_at);
        }
        let epoch = Epoch(row.epoch.unwrap_or_default());
        let tenure = row.tenure.unwrap_or_default();
        let send = Instant::now();
        match timeout(lease - margin, self.renew(conn, epoch, tenure)).await {
            Ok(Ok(true)) => Ok(send),
            Ok(Err(err)) => Err(err.to_string()),
            _ => Err("the new lease could not be confirmed".to_owned()),
        }
    }

    /// Records the new tenure: its [`Leadership`], metrics, log line and state.
    pub(super) fn begin_tenure(
        &self,
        row: &CampaignRow,
        sent_at: Instant,
        metrics: &RoleMetrics,
        session: SharedSession,
    ) -> Leadership {
        let epoch = Epoch(row.epoch.unwrap_or_default());
        let since = row.leader_since.unwrap_or_else(Utc::now);
        let lease = self.election.lease_duration;
        // The server's idle timer can only have started after the call was sent.
        let deadline = sent_at + lease - self.election.safety_margin();
        let leadership = Leadership::new(Tenure::new(
            TenureParts {
                role: self.role().clone(),
                namespace: self.namespace.clone(),
                node_id: self.node_id.clone(),
                epoch,
                id: row.tenure.unwrap_or_default(),
                acquired_at: since,
                lease,
                pool: self.pool.clone(),
                metrics: self.metrics.scoped(),
            },
            session,
            deadline,
        ));
        metrics.is_leader.set(1.0);
        metrics.epoch.set(epoch.0 as f64);
        metrics.elections.increment(1);
        let failover = row.failover == Some(true);
        if failover {
            metrics.failovers.increment(1);
        }
        info!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0,
              failover, "became leader");
        self.handle.set_current(Some(leadership.clone()));
        self.set_state(RoleState::Leader { epoch, since });
        leadership
    }

    /// Renews the lease until the node shuts down or the leadership is lost.
    async fn hold(
        &mut self,
        session: &SharedSession,
        leadership: &Leadership,
        metrics: &RoleMetrics,
    ) -> Hold {
        let refresh = self.election.refresh_interval;
        let acquired = Instant::now();
        let mut last_sent = leadership.tenure().deadline() + self.election.safety_margin()
            - self.election.lease_duration;
        // Placement moves asked of an earlier tenure are not this one's.
        let mut moves = self.handle.moves.subscribe();
        moves.borrow_and_update();
        loop {
            let deadline = leadership.tenure().deadline();
            tokio::select! {
                biased;
                _ = sleep_until(deadline) => return Hold::Lost(LossReason::Deadline),
                _ = self.shutdown.cancelled() => return Hold::Shutdown,
                event = self.events.recv() => match self.hear(event) {
                    Heard::Notice(notice) if notice.epoch > leadership.epoch().0 => {
                        return Hold::Lost(LossReason::Deposed);
                    }
                    Heard::Notice(notice)
                        if notice.event == STEP_DOWN && notice.epoch == leadership.epoch().0 =>
                    {
                        info!(target: "forge::leader", role = %self.role(), node = %self.node_id,
                              epoch = notice.epoch, "asked to step down; handing over");
                        return Hold::StepDown;
                    }
                    // Verify now rather than at the next renewal.
                    Heard::Verify => last_sent = Instant::now() - refresh,
                    _ => {}
                },
                Ok(()) = moves.changed() => {
                    if let Some(to) = moves.borrow_and_update().clone() {
                        info!(target: "forge::leader", role = %self.role(), node = %self.node_id,
                              epoch = leadership.epoch().0, to = %to.to, why = %to.why,
                              "handing the role over to spread leadership");
                        return Hold::Move(to);
                    }
                }
                _ = sleep_until(last_sent + refresh) => {
                    match self.renew_lease(session, leadership).await {
                        Ok(sent) => {
                            last_sent = sent;
                            metrics.tenure.set(acquired.elapsed().as_secs_f64());
                        }
                        Err(reason) => return Hold::Lost(reason),
                    }
                }
            }
        }
    }

    /// One renewal on the lock session (after the duty statement running on it, if any),
    /// bounded by the local deadline; extends the deadline on success and returns when the
    /// renewal was sent.
    pub(super) async fn renew_lease(
        &self,
        session: &SharedSession,
        leadership: &Leadership,
    ) -> std::result::Result<Instant, LossReason> {
        let deadline = leadership.tenure().deadline();
        let renewal = async {
            let mut conn = session.lock().await;
            let send = Instant::now();
            let renewed = match conn.as_mut() {
                Some(conn) => {
                    self.renew(conn, leadership.epoch(), leadership.tenure_id())
                        .await
                }
                None => Ok(false),
            };
            renewed.map(|renewed| (renewed, send))
        };
        match timeout_at(deadline, renewal).await {
            Ok(Ok((true, send))) => {
                leadership
                    .tenure()
                    .extend_to(send + self.election.lease_duration - self.election.safety_margin());
                Ok(send)
            }
            Ok(Ok((false, _))) => Err(LossReason::Deposed),
            Ok(Err(err)) => {
                warn!(target: "forge::leader", role = %self.role(), node = %self.node_id,
                      epoch = leadership.epoch().0, error = %err, "lease renewal failed");
                Err(LossReason::RenewalFailed)
            }
            Err(_) => Err(LossReason::Deadline),
        }
    }

    pub(super) async fn renew(
        &self,
        conn: &mut PgConnection,
        epoch: Epoch,
        tenure: i64,
    ) -> Result<bool, sqlx::Error> {
        let renewed = sqlx::query(
            "UPDATE forge.leaders
                SET renewed_at = clock_timestamp(),
                    lease_until = clock_timestamp() + make_interval(secs => $5 / 1000.0)
              WHERE namespace = $1 AND role = $2 AND epoch = $3 AND tenure = $4
                AND backend_pid = pg_backend_pid()",
        )
        .bind(&self.namespace)
        .bind(self.role())
        .bind(epoch)
        .bind(tenure)
        .bind(self.election.lease_duration.as_millis() as i64)
        .execute(&mut *conn)
        .await?;
        Ok(renewed.rows_affected() == 1)
    }

    pub(super) async fn release(
        &self,
        conn: &mut PgConnection,
        epoch: Epoch,
        tenure: i64,
        to: Option<&PlacementMove>,
    ) -> Result<bool, sqlx::Error> {
        // The named node is a standby waiting inside the lock: the lock reaches it in
        // milliseconds; past the window any waiter may take it (the node may have died).
        let window = self.election.lock_timeout.as_millis() as i64;
        sqlx::query_scalar("SELECT forge.release($1, $2, $3, $4, $5, $6, $7, $8)")
            .bind(&self.namespace)
            .bind(self.role())
            .bind(self.key.0)
            .bind(epoch)
            .bind(tenure)
            .bind(to.map(|m| m.to.as_str()))
            .bind(to.map(|m| m.why.as_str()))
            .bind(window)
            .fetch_one(&mut *conn)
            .await
    }

    pub(super) fn start_tasks(&self, leadership: &Leadership) -> JoinSet<()> {
        let mut set = JoinSet::new();
        for (name, task) in &self.tasks {
            let work = task(leadership.clone());
            let leadership = leadership.clone();
            let name = name.clone();
            set.spawn(async move {
                if leadership.run(work).await.is_none() {
                    debug!(target: "forge::leader", role = %leadership.role(), task = %name, "leader task cancelled");
                }
            });
        }
        set
    }

    /// Graceful handoff: stop new work, drain up to `drain_timeout` while still renewing the
    /// lease (so no other node can lead while the old work runs), release, close. `asked`:
    /// `None` at shutdown; `Some(None)` on a step-down; `Some(Some(move))` for a placement move,
    /// whose node the release names.
    pub(super) async fn hand_over(
        &mut self,
        session: &SharedSession,
        leadership: Leadership,
        mut tasks: JoinSet<()>,
        metrics: &RoleMetrics,
        asked: Option<Option<PlacementMove>>,
    ) -> SessionEnd {
        let (reason, to) = match asked {
            None => (LossReason::Shutdown, None),
            Some(None) => (LossReason::StepDown, None),
            Some(Some(to)) => (LossReason::Rebalance, Some(to)),
        };
        let started = Instant::now();
        let epoch = leadership.epoch();
        leadership.tenure().draining.cancel();
        let drained = self.drain(session, &leadership, &mut tasks).await;
        if let Err(why) = drained {
            warn!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0,
                  drain_timeout = ?self.election.drain_timeout, why, "leader-only work did not finish; cancelling it");
        }
        leadership.tenure().lost.cancel();
        stop_tasks(&mut tasks).await;
        self.handle.set_current(None);
        let Some(mut conn) = take_session(session).await else {
            metrics.lost(reason);
            warn!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0,
                  "the lock session was still in use at handoff; closing it without a release");
            return SessionEnd::Shutdown;
        };
        let released = if leadership.deadline_passed() {
            Ok(Ok(false))
        } else {
            timeout(
                Duration::from_secs(5),
                self.release(&mut conn, epoch, leadership.tenure_id(), to.as_ref()),
            )
            .await
        };
        metrics.lost(reason);
        metrics.handoff.record(started.elapsed().as_secs_f64());
        match released {
            Ok(Ok(true)) => {
                info!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0,
                                  drain_ms = started.elapsed().as_millis() as u64, "handed over leadership")
            }
            other => {
                warn!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0,
                           outcome = ?other.map(|r| r.map_err(|e| e.to_string())), "leadership was already gone at handoff")
            }
        }
        close(conn).await;
        SessionEnd::Shutdown
    }

    /// Waits for the leader tasks to finish, for at most `drain_timeout`, renewing the lease
    /// meanwhile. Fails (with why) at the bound, or when the lease cannot be kept: then the
    /// work must stop at once, since another node may take over.
    pub(super) async fn drain(
        &mut self,
        session: &SharedSession,
        leadership: &Leadership,
        tasks: &mut JoinSet<()>,
    ) -> std::result::Result<(), &'static str> {
        let bound = Instant::now() + self.election.drain_timeout;
        let refresh = self.election.refresh_interval;
        let mut next_renewal = Instant::now() + refresh;
        loop {
            tokio::select! {
                biased;
                joined = tasks.join_next() => if joined.is_none() { return Ok(()) },
                _ = sleep_until(bound) => return Err("drain_timeout reached"),
                // As while holding: a newer leadership (the session was ended, or a promoted
                // standby elected another) means the old work must stop at once.
                event = self.events.recv() => match self.hear(event) {
                    Heard::Notice(notice) if notice.epoch > leadership.epoch().0 => {
                        return Err("a newer leadership was announced while draining");
                    }
                    Heard::Verify => next_renewal = Instant::now(),
                    _ => {}
                },
                _ = sleep_until(next_renewal) => {
                    if self.renew_lease(session, leadership).await.is_err() {
                        return Err("the lease could not be renewed while draining");
                    }
                    next_renewal = Instant::now() + refresh;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LossReason;

    /// The reasons are metric labels, event fields and log values: their strings are a contract.
    #[test]
    fn loss_reasons_keep_their_strings() {
        let names: Vec<&str> = LossReason::ALL
            .iter()
            .map(|reason| reason.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "deadline",
                "deposed",
                "renewal_failed",
                "shutdown",
                "step_down",
                "rebalance"
            ]
        );
        assert_eq!(LossReason::StepDown.to_string(), "step_down");
    }
}
