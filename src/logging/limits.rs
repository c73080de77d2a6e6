//! The two limits every line passes: a token bucket per call site for warnings and
//! errors ([`RateLimiter`]), then the one budget of the whole daemon ([`LogBudget`]).

use std::collections::HashMap;
use std::time::Instant;

use log::LevelFilter;

use super::{BUDGET, BUDGET_REPORT, BURST, DEBUG_BUDGET, MAX_SITES, REFILL, SUMMARY_PERIOD};

/// A call site: the module and line of the `log!` macro.
#[derive(Clone, Copy, Debug)]
pub struct Site<'a> {
    pub module: &'a str,
    pub line: u32,
}

#[derive(Debug, Eq, PartialEq)]
pub enum Admit {
    /// Log it; `suppressed` messages of this site were dropped since the last one.
    Emit {
        suppressed: u64,
    },
    Drop,
}

struct SiteState {
    module: String,
    line: u32,
    tokens: f64,
    last: Instant,
    suppressed: u64,
    last_drop: Instant,
}

/// A token bucket per call site: [`BURST`] at once, refilled at one per [`REFILL`].
#[derive(Default)]
pub struct RateLimiter {
    sites: HashMap<u64, SiteState>,
}

impl RateLimiter {
    pub fn admit(&mut self, site: &Site, now: Instant) -> Admit {
        if self.sites.len() >= MAX_SITES && !self.sites.contains_key(&key_ref(site)) {
            // Forget sites with nothing pending; a real binary never gets here.
            self.sites.retain(|_, s| s.suppressed > 0);
        }
        let s = self
            .sites
            .entry(key_ref(site))
            .or_insert_with(|| SiteState {
                module: site.module.to_string(),
                line: site.line,
                tokens: f64::from(BURST),
                last: now,
                suppressed: 0,
                last_drop: now,
            });
        let refill = now.saturating_duration_since(s.last).as_secs_f64() / REFILL.as_secs_f64();
        s.tokens = (s.tokens + refill).min(f64::from(BURST));
        s.last = now;
        if s.tokens >= 1.0 {
            s.tokens -= 1.0;
            let suppressed = std::mem::take(&mut s.suppressed);
            Admit::Emit { suppressed }
        } else {
            s.suppressed += 1;
            s.last_drop = now;
            Admit::Drop
        }
    }

    /// Whether any site dropped messages not reported yet.
    pub fn any_suppressed(&self) -> bool {
        self.sites.values().any(|s| s.suppressed > 0)
    }

    /// Sites that dropped messages and dropped none for [`SUMMARY_PERIOD`]: their
    /// counts, reset to zero.
    pub fn take_quiet(&mut self, now: Instant) -> Vec<(String, u32, u64)> {
        let mut out = Vec::new();
        for s in self.sites.values_mut() {
            if s.suppressed > 0 && now.saturating_duration_since(s.last_drop) >= SUMMARY_PERIOD {
                out.push((s.module.clone(), s.line, std::mem::take(&mut s.suppressed)));
            }
        }
        out
    }
}

/// A log budget: lines at once, then lines a second.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct Budget {
    pub burst: u32,
    pub per_second: u32,
}

impl Budget {
    /// [`DEBUG_BUDGET`] at `debug` and `trace`, else [`BUDGET`].
    pub fn for_level(level: LevelFilter) -> Budget {
        if level >= LevelFilter::Debug {
            DEBUG_BUDGET
        } else {
            BUDGET
        }
    }
}

/// One token bucket for every line the daemon writes (but [`LIFECYCLE`]'s), with the
/// count of the lines it refused.
pub struct LogBudget {
    pub(super) budget: Budget,
    tokens: f64,
    last: Instant,
    dropped: u64,
    last_report: Option<Instant>,
}

impl LogBudget {
    /// Full at `now`.
    pub fn new(budget: Budget, now: Instant) -> Self {
        LogBudget {
            budget,
            tokens: f64::from(budget.burst),
            last: now,
            dropped: 0,
            last_report: None,
        }
    }

    /// Takes a token for one line. Without one, false, and `weight` lines (the line
    /// and any it stood for) are counted as dropped.
    pub fn admit(&mut self, now: Instant, weight: u64) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * f64::from(self.budget.per_second))
            .min(f64::from(self.budget.burst));
        self.last = self.last.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.dropped += weight;
            false
        }
    }

    /// The lines dropped and not reported yet.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The lines dropped since the last report, reset to zero: None when there are
    /// none, or when the last report is less than [`BUDGET_REPORT`] old.
    pub fn take_report(&mut self, now: Instant) -> Option<u64> {
        if self.dropped == 0
            || self
                .last_report
                .is_some_and(|t| now.saturating_duration_since(t) < BUDGET_REPORT)
        {
            return None;
        }
        self.last_report = Some(now);
        Some(std::mem::take(&mut self.dropped))
    }
}

/// No allocation per record: sites are keyed by a hash of module and line.
fn key_ref(site: &Site) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    site.module.hash(&mut h);
    site.line.hash(&mut h);
    h.finish()
}
