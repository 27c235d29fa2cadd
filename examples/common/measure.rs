//! What the hub benchmarks read of a process and of a set of latencies: shared by the hub's
//! benchmark and its etcd peer, so that both are measured alike.

use std::time::Duration;

use anyhow::anyhow;

/// The `p` quantile (0..=1) of `sorted`, which must not be empty.
pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// (resident KiB, CPU seconds) of `pid`.
pub(crate) fn usage(pid: u32) -> anyhow::Result<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS for pid {pid}"))?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|s| s.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok((rss, ticks as f64 / 100.0))
}
