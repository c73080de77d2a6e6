//! The latency percentiles of a workload's completions.

use super::Latency;

pub(crate) fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx] as f64 / 1000.0
}

/// The percentiles of latencies in ns, sorted.
pub(crate) fn latency(sorted: &[u64]) -> Latency {
    let mean = if sorted.is_empty() {
        0.0
    } else {
        sorted.iter().sum::<u64>() as f64 / sorted.len() as f64 / 1000.0
    };
    Latency {
        p50_us: percentile(sorted, 0.50),
        p99_us: percentile(sorted, 0.99),
        p999_us: percentile(sorted, 0.999),
        mean_us: mean,
        max_us: sorted.last().copied().unwrap_or(0) as f64 / 1000.0,
    }
}
