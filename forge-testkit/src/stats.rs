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
