//! Step-down storms.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::time::Duration;

use forge::inspect::StepDown;
use forge::{LockNamespace, Role};
use tokio::time::Instant;

use super::{Harness, Phase, StepDownRecord, Storm};
use crate::ADMIN_TIMEOUT;

impl Harness {
    pub(super) fn start_storm(&mut self) -> Option<String> {
        let running: Vec<usize> = (0..self.slots.len())
            .filter(|i| self.eligible(*i))
            .collect();
        if running.is_empty() {
            return None;
        }
        let alone = running.len() == self.slots.len() && self.rng.chance(0.5);
        let mut roles: Vec<Role> = Role::BUILTIN.to_vec();
        for i in (1..roles.len()).rev() {
            let j = self.rng.below(i + 1);
            roles.swap(i, j);
        }
        let mut plan = Vec::new();
        let mut offset = Duration::ZERO;
        for role in roles {
            for _ in 0..3 + self.rng.below(3) {
                plan.push((offset, role.clone(), alone && self.rng.chance(0.5)));
                offset += self.rng.secs(0.2, 2.0);
            }
        }
        let mut held = Vec::new();
        let mut text = if alone {
            let survivor = running[self.rng.below(running.len())];
            let now = Instant::now();
            for i in running.iter().copied().filter(|i| *i != survivor) {
                let phase =
                    std::mem::replace(&mut self.slots[i].phase, Phase::Dead { restart_at: now });
                if let Phase::Running { proc } = phase {
                    let _ = proc.terminate();
                    self.slots[i].phase = Phase::Terminating { proc, since: now };
                } else {
                    self.slots[i].phase = phase;
                }
                self.slots[i].hold_until = Some(now + Duration::from_secs(600));
                held.push(i);
            }
            let stopped: Vec<&str> = held.iter().map(|i| self.slots[*i].id.as_str()).collect();
            format!(
                "step-down storm with one eligible node: SIGTERM {} (kept down), then with only {} running: ",
                stopped.join(", "),
                self.slots[survivor].id
            )
        } else {
            "step-down storm with standbys waiting: ".to_owned()
        };
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for (_, role, _) in &plan {
            *counts.entry(role.name().to_owned()).or_default() += 1;
        }
        let counts: Vec<String> = counts.iter().map(|(r, n)| format!("{r} x{n}")).collect();
        let _ = write!(
            text,
            "{} forge.step_down requests ({}) over {:.1} s",
            plan.len(),
            counts.join(", "),
            offset.as_secs_f64()
        );
        self.storm = Some(Storm {
            alone,
            held,
            plan,
            queue: VecDeque::new(),
            started: false,
            wait_deadline: Instant::now() + Duration::from_secs(30),
            end_at: None,
        });
        Some(text)
    }

    pub(super) async fn tend_storm(&mut self) {
        let Some(storm) = &mut self.storm else {
            return;
        };
        let now = Instant::now();
        if !storm.started {
            let held_down = storm
                .held
                .iter()
                .all(|i| matches!(self.slots[*i].phase, Phase::Dead { .. }));
            if !held_down && now < storm.wait_deadline {
                return;
            }
            storm.queue = storm
                .plan
                .iter()
                .map(|(offset, role, force)| (now + *offset, role.clone(), *force))
                .collect();
            storm.started = true;
        }
        let alone = storm.alone;
        while let Some((due, _, _)) = self.storm.as_ref().and_then(|s| s.queue.front()) {
            if *due > now {
                break;
            }
            let Some((_, role, force)) = self.storm.as_mut().and_then(|s| s.queue.pop_front())
            else {
                break;
            };
            let outcome = self.step_down(&role, force).await;
            self.note(format!(
                "step-down {}{}: {outcome}",
                role.name(),
                if force { " (force)" } else { "" }
            ));
            self.step_downs.push(StepDownRecord {
                at: self.secs(),
                role: role.name().to_owned(),
                alone,
                outcome,
            });
        }
        let Some(storm) = &mut self.storm else {
            return;
        };
        if storm.queue.is_empty() && storm.end_at.is_none() {
            storm.end_at = Some(now + Duration::from_secs(3));
        }
        if storm.end_at.is_some_and(|t| now >= t) {
            let held = std::mem::take(&mut storm.held);
            self.storm = None;
            for i in &held {
                self.slots[*i].hold_until = None;
            }
            self.note(if held.is_empty() {
                "step-down storm over".to_owned()
            } else {
                "step-down storm over; the stopped nodes start again".to_owned()
            });
        }
    }

    /// An operator's step-down request, through the path the admin API and the CLI use
    /// (`forge::inspect::Cluster::step_down`, the SQL function `forge.step_down`).
    ///
    /// `force`: a step-down with no standby waiting is refused unless forced (the storm asks
    /// with force half the time when one node is eligible).
    async fn step_down(&self, role: &Role, force: bool) -> String {
        let cluster = forge::inspect::Cluster::new(
            self.admin.clone(),
            LockNamespace::default(),
            Duration::from_millis(1500),
        );
        let asked = cluster.step_down(role, "forge-soak", force);
        match tokio::time::timeout(ADMIN_TIMEOUT, asked).await {
            Ok(Ok(StepDown::Asked {
                epoch, standbys, ..
            })) => format!("asked epoch {} ({standbys} standbys waiting)", epoch.0),
            Ok(Ok(StepDown::NoStandby { epoch, .. })) => {
                format!("refused: no standby waits (epoch {})", epoch.0)
            }
            Ok(Ok(StepDown::NoLeader)) => "no live leader".to_owned(),
            Ok(Err(err)) => format!("error: {err}"),
            Err(_) => "no answer within 5 s".to_owned(),
        }
    }
}
