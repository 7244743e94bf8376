//! The process' own figures, read from `/proc/self` at each scrape (Linux only; elsewhere none
//! are exported), under the names every Prometheus client library uses: CPU time, resident and
//! virtual memory, open and maximum file descriptors, threads, start time.

use std::collections::BTreeSet;

use super::registry::{write_f64, write_help};

/// One figure: name, type, help, value.
type Figure = (&'static str, &'static str, &'static str, f64);

/// Appends the process figures that could be read, but those of a family in `skip` (which the
/// application exports itself).
pub(super) fn render(out: &mut String, skip: &BTreeSet<&str>) {
    for (name, kind, help, value) in figures() {
        if skip.contains(name) {
            continue;
        }
        write_help(out, name, help);
        out.push_str("# TYPE ");
        out.push_str(name);
        out.push(' ');
        out.push_str(kind);
        out.push('\n');
        out.push_str(name);
        out.push(' ');
        write_f64(out, value);
        out.push_str("\n\n");
    }
}

#[cfg(target_os = "linux")]
fn figures() -> Vec<Figure> {
    let mut figures = Vec::new();
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let aux = auxv();
    let ticks = aux.clock_ticks.unwrap_or(100) as f64;
    if let Some(stat) = read("/proc/self/stat") {
        // The fields after the command (in parentheses, which may hold spaces), from the 3rd.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<f64>().ok());
        if let (Some(user), Some(system)) = (field(14), field(15)) {
            figures.push((
                "process_cpu_seconds_total",
                "counter",
                "Total user and system CPU time spent in seconds.",
                (user + system) / ticks,
            ));
        }
        if let Some(threads) = field(20) {
            figures.push((
                "process_threads",
                "gauge",
                "Number of OS threads in the process.",
                threads,
            ));
        }
        if let Some(vsize) = field(23) {
            figures.push((
                "process_virtual_memory_bytes",
                "gauge",
                "Virtual memory size in bytes.",
                vsize,
            ));
        }
        if let (Some(rss), Some(page)) = (field(24), aux.page_size) {
            figures.push((
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size in bytes.",
                rss * page as f64,
            ));
        }
        let boot = read("/proc/stat").and_then(|stat| {
            stat.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|s| s.trim().parse::<f64>().ok())
        });
        if let (Some(start), Some(boot)) = (field(22), boot) {
            figures.push((
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since unix epoch in seconds.",
                boot + start / ticks,
            ));
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        figures.push((
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            // The directory's own descriptor, open while it is read, is not counted.
            fds.count().saturating_sub(1) as f64,
        ));
    }
    let max_fds = read("/proc/self/limits").and_then(|limits| {
        limits
            .lines()
            .find_map(|l| l.strip_prefix("Max open files"))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
    });
    if let Some(max) = max_fds {
        figures.push((
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            max,
        ));
    }
    figures.sort_by_key(|f| f.0);
    figures
}

#[cfg(not(target_os = "linux"))]
fn figures() -> Vec<Figure> {
    Vec::new()
}

/// What the kernel told the process at start (`/proc/self/auxv`): the clock tick rate of
/// `/proc` times and the page size (read there, as `sysconf` would, without `unsafe`).
#[cfg(target_os = "linux")]
#[derive(Default)]
struct Aux {
    clock_ticks: Option<u64>,
    page_size: Option<u64>,
}

#[cfg(target_os = "linux")]
fn auxv() -> Aux {
    const AT_PAGESZ: usize = 6;
    const AT_CLKTCK: usize = 17;
    let mut aux = Aux::default();
    let Ok(bytes) = std::fs::read("/proc/self/auxv") else {
        return aux;
    };
    let word = std::mem::size_of::<usize>();
    for pair in bytes.chunks_exact(2 * word) {
        let read = |at: usize| {
            let mut buf = [0u8; std::mem::size_of::<usize>()];
            buf.copy_from_slice(&pair[at..at + word]);
            usize::from_ne_bytes(buf)
        };
        match read(0) {
            AT_PAGESZ => aux.page_size = Some(read(word) as u64),
            AT_CLKTCK => aux.clock_ticks = Some(read(word) as u64),
            _ => {}
        }
    }
    aux
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn the_process_figures_are_read() {
        let mut out = String::new();
        super::render(&mut out, &Default::default());
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_threads",
            "process_start_time_seconds",
        ] {
            assert!(
                out.contains(&format!("\n{name} ")),
                "missing {name} in\n{out}"
            );
        }
        let value = |name: &str| -> f64 {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .unwrap()
                .parse()
                .unwrap()
        };
        assert!(value("process_resident_memory_bytes") > 1e6, "{out}");
        assert!(value("process_threads") >= 1.0, "{out}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = value("process_start_time_seconds");
        assert!(
            started <= now + 1.0 && started > now - 24.0 * 3600.0,
            "{out}"
        );
    }
}
