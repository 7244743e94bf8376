//! Cluster-wide limits of a queue or of a job kind: how many of its jobs run at once on all
//! nodes together (`global_concurrency`), and how many are claimed in any window (`rate`,
//! optionally per value of one top-level argument, `rate_key`). Stored in `forge.queue_limits`
//! and `forge.kind_limits` and checked by every claim in `forge.jobs_step`, so they hold
//! whichever node claims and change without a restart. forge.toml (a queue's) or the kind's
//! declared options (a kind's) give their values at start; an operator's values
//! ([`crate::inspect::Workload::set_queue_limits`],
//! [`crate::inspect::Workload::set_kind_limits`]) win until reset.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use forge_rules::format_duration;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// At most `count` claims in any window of `per` (`"100/1m"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Claims allowed in one window.
    pub count: u32,
    /// The window.
    pub per: Duration,
}

pub use forge_rules::MAX_LIMIT;

impl FromStr for Rate {
    type Err = String;

    fn from_str(text: &str) -> Result<Rate, String> {
        let (count, per) = forge_rules::parse_rate(text)?;
        Ok(Rate { count, per })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, format_duration(self.per))
    }
}

impl Serialize for Rate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Rate, D::Error> {
        let text = String::deserialize(d)
            .map_err(|_| serde::de::Error::custom("expected a rate string such as \"100/1m\""))?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A queue's or a job kind's cluster-wide limits (none: unlimited).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct QueueLimits {
    /// At most this many of the queue's jobs run at once on all nodes together (claimed jobs
    /// count until their attempt's outcome is recorded, or they are rescued).
    pub global_concurrency: Option<u32>,
    /// At most so many claims of the queue's jobs in any window.
    pub rate: Option<Rate>,
    /// The rate holds per value of this top-level field of the jobs' arguments (a job without
    /// it counts under one shared empty value).
    pub rate_key: Option<String>,
}

/// `global 16, rate 100/1m per customer_id`, or `no limits`.
impl fmt::Display for QueueLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(n) = self.global_concurrency {
            parts.push(format!("global {n}"));
        }
        if let Some(rate) = self.rate {
            parts.push(match &self.rate_key {
                Some(key) => format!("rate {rate} per {key}"),
                None => format!("rate {rate}"),
            });
        }
        match parts.is_empty() {
            true => f.write_str("no limits"),
            false => f.write_str(&parts.join(", ")),
        }
    }
}

impl QueueLimits {
    /// Limits from their parts, checked: a global concurrency between 1 and [`MAX_LIMIT`], a
    /// rate key only with a rate.
    pub fn new(
        global_concurrency: Option<u32>,
        rate: Option<Rate>,
        rate_key: Option<String>,
    ) -> Result<QueueLimits, String> {
        let limits = QueueLimits {
            global_concurrency,
            rate,
            rate_key,
        };
        limits.check().map(|()| limits)
    }

    /// Whether it limits anything.
    pub fn is_empty(&self) -> bool {
        self.global_concurrency.is_none() && self.rate.is_none()
    }

    /// What is wrong with the values, for the key (relative to the queue's table) that says it.
    pub(crate) fn problem(&self) -> Option<(&'static str, String)> {
        if let Some(n) = self.global_concurrency
            && (n == 0 || n > MAX_LIMIT)
        {
            return Some((
                "global_concurrency",
                format!(
                    "global_concurrency {n} must be between 1 and {MAX_LIMIT} (to stop a queue, pause it)"
                ),
            ));
        }
        if let Some(key) = &self.rate_key {
            if self.rate.is_none() {
                return Some((
                    "rate_key",
                    "rate_key needs a rate (such as rate = \"100/1m\"): it says per which argument the rate holds".into(),
                ));
            }
            if key.is_empty() {
                return Some((
                    "rate_key",
                    "rate_key must name a top-level field of the jobs' arguments, such as \"customer_id\"".into(),
                ));
            }
        }
        None
    }

    fn check(&self) -> Result<(), String> {
        match self.problem() {
            Some((_, message)) => Err(message),
            None => Ok(()),
        }
    }

    /// Limits as stored (`forge.queue_limits`, `forge.kind_limits`).
    pub(crate) fn from_stored(
        global_concurrency: Option<i32>,
        rate_count: Option<i32>,
        rate_window_ms: Option<i64>,
        rate_key: Option<String>,
    ) -> QueueLimits {
        QueueLimits {
            global_concurrency: global_concurrency.map(|n| n.max(0) as u32),
            rate: rate_count.zip(rate_window_ms).map(|(n, ms)| Rate {
                count: n.max(0) as u32,
                per: Duration::from_millis(ms.max(0) as u64),
            }),
            rate_key,
        }
    }

    /// Writes these limits of a queue or a kind (`by`: the operator, or `None` for forge.toml's
    /// or the code's).
    pub(crate) async fn write<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        db: E,
        namespace: &str,
        limited: Limited,
        name: &str,
        by: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        let sql = match limited {
            Limited::Queue => "SELECT forge.queue_limit_set($1, $2, $3, $4, $5, $6, $7)",
            Limited::Kind => "SELECT forge.kind_limit_set($1, $2, $3, $4, $5, $6, $7)",
        };
        sqlx::query_scalar(sql)
            .bind(namespace)
            .bind(name)
            .bind(self.global_concurrency.map(|n| n as i32))
            .bind(self.rate.map(|r| r.count as i32))
            .bind(
                self.rate
                    .map(|r| r.per.as_millis().min(i64::MAX as u128) as i64),
            )
            .bind(self.rate_key.as_deref())
            .bind(by)
            .fetch_one(db)
            .await
    }
}

/// What a set of limits bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Limited {
    /// The jobs of a queue (`forge.queue_limits`, from forge.toml).
    Queue,
    /// The jobs of a kind, in whichever queue (`forge.kind_limits`, from the kind's options).
    Kind,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_print_back() {
        let rate: Rate = "100/1m".parse().unwrap();
        assert_eq!(rate.count, 100);
        assert_eq!(rate.per, Duration::from_secs(60));
        assert_eq!(rate.to_string().parse::<Rate>().unwrap(), rate);
        for bad in ["100", "0/1m", "x/1m", "10/", "10/0s", "2000000/1s"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn a_rate_key_needs_a_rate() {
        assert!(QueueLimits::new(None, None, Some("customer_id".into())).is_err());
        assert!(QueueLimits::new(Some(0), None, None).is_err());
        assert!(QueueLimits::new(Some(4), "1/1s".parse().ok(), Some("c".into())).is_ok());
    }
}
