//! Small helpers for benchmarks that print figures.

/// The `p`-th percentile (nearest rank) of `values`; `None` when empty.
///
/// ```
/// let v = [5.0, 1.0, 3.0, 2.0, 4.0];
/// assert_eq!(forge_testkit::stats::percentile(&v, 50.0), Some(3.0));
/// assert_eq!(forge_testkit::stats::percentile(&v, 100.0), Some(5.0));
/// ```
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// One line: `name  n=..  p50=..  p99=..  max=..` with a unit.
pub fn summary(name: &str, values: &[f64], unit: &str) -> String {
    let at = |p| percentile(values, p).unwrap_or(f64::NAN);
    format!(
        "  {name:<44} n={:<4} p50={:>8.2} {unit}  p99={:>8.2} {unit}  max={:>8.2} {unit}",
        values.len(),
        at(50.0),
        at(99.0),
        at(100.0)
    )
}

/// Resident set size of a process in KiB, from `/proc/<pid>/status` (Linux).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// CPU time (user + system) a process has used, in seconds, from `/proc/<pid>/stat` (Linux).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, fields) = parse_stat(&stat)?;
    Some(ticks(&fields, 11)? + ticks(&fields, 12)?)
}

/// CPU time (user + system) used by a process and its live children, in seconds (Linux): for
/// a PostgreSQL server, its postmaster's pid gives every backend and auxiliary process. A child
/// that ended between two readings takes its time with it (its parent's counters of waited-for
/// children are not added), so compare readings taken while the same processes live.
pub fn tree_cpu_seconds(parent: u32) -> Option<f64> {
    let mut total = cpu_seconds(parent)?;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((ppid, fields)) = parse_stat(&stat)
            && ppid == parent
        {
            total += ticks(&fields, 11).unwrap_or(0.0) + ticks(&fields, 12).unwrap_or(0.0);
        }
    }
    Some(total)
}

/// The parent pid and the fields after the command name of a `/proc/<pid>/stat` line (the
/// name is in parentheses and may hold spaces).
fn parse_stat(stat: &str) -> Option<(u32, Vec<&str>)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((fields.get(1)?.parse().ok()?, fields))
}

/// Field `at` (0-based after the command name: 11 = utime, 12 = stime) in seconds.
fn ticks(fields: &[&str], at: usize) -> Option<f64> {
    Some(fields.get(at)?.parse::<f64>().ok()? / crate::sys::clock_ticks_per_second())
}

/// The parent of a process, from `/proc/<pid>/stat` (Linux): for a PostgreSQL backend's pid
/// (`pg_backend_pid()`), the postmaster.
pub fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(parse_stat(&stat)?.0)
}
