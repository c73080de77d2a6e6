//! A token bucket of the shape cloud-hypervisor and Firecracker give their block and
//! net devices: `size` tokens, refilled from empty to full in `refill_time_ms`, and a
//! `one_time_burst` of extra tokens that is spent first and never refilled.
//!
//! A request may cost more than the bucket holds (a 1 MiB READ against a 64 KiB
//! bucket): it goes once the bucket is full, and leaves it in debt, so the requests
//! after it wait for the whole of its cost to refill.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One bucket's parameters, as the control API and `--allowed-dir` give them.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BucketConfig {
    /// Tokens the bucket holds when full (requests, or bytes).
    pub size: u64,
    /// Extra tokens available once, at the start, spent before the bucket's own.
    #[serde(default)]
    pub one_time_burst: u64,
    /// Milliseconds to refill the bucket from empty to full.
    pub refill_time_ms: u64,
}

/// Bucket parameters a bucket cannot run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketError {
    ZeroSize,
    ZeroRefillTime,
    SizeTooLarge,
    RefillTimeTooLong,
}

impl std::fmt::Display for BucketError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BucketError::ZeroSize => "size must be above 0 (remove the bucket to lift its limit)",
            BucketError::ZeroRefillTime => "refill_time_ms must be above 0",
            BucketError::SizeTooLarge => "size and one_time_burst must be at most 2^48",
            BucketError::RefillTimeTooLong => "refill_time_ms must be at most 2^32",
        })
    }
}

impl std::error::Error for BucketError {}

impl BucketConfig {
    /// The parameters a bucket can run with: a size and a refill time, each above 0,
    /// and a rate (size per refill time) the arithmetic cannot overflow.
    pub fn check(&self) -> Result<(), BucketError> {
        if self.size == 0 {
            return Err(BucketError::ZeroSize);
        }
        if self.refill_time_ms == 0 {
            return Err(BucketError::ZeroRefillTime);
        }
        // Bounds that keep every product below in u128 and every wait representable.
        if self.size > 1 << 48 || self.one_time_burst > 1 << 48 {
            return Err(BucketError::SizeTooLarge);
        }
        if self.refill_time_ms > 1 << 32 {
            return Err(BucketError::RefillTimeTooLong);
        }
        Ok(())
    }

    /// Tokens per second it allows, the one-time burst aside.
    pub fn rate(&self) -> f64 {
        self.size as f64 * 1000.0 / self.refill_time_ms as f64
    }

    fn refill_ns(&self) -> u128 {
        u128::from(self.refill_time_ms) * 1_000_000
    }
}

#[derive(Debug)]
pub struct TokenBucket {
    config: BucketConfig,
    /// Tokens now: at most `size`, below 0 after a request that cost more than that.
    budget: i128,
    burst: u64,
    /// When `budget` was last brought up to date.
    updated: Instant,
}

impl TokenBucket {
    /// A full bucket (as Firecracker starts one) with its one-time burst.
    pub fn new(config: BucketConfig, now: Instant) -> Self {
        TokenBucket {
            config,
            budget: i128::from(config.size),
            burst: config.one_time_burst,
            updated: now,
        }
    }

    pub fn config(&self) -> BucketConfig {
        self.config
    }

    /// Adds the tokens refilled since the last update. Only whole tokens are added,
    /// and the clock moves on only by the time they took, so no fraction is lost
    /// however often this runs.
    fn refill(&mut self, now: Instant) {
        let size = i128::from(self.config.size);
        // `now` may be a little stale and come from another queue's thread than the
        // last update's: the clock of the bucket never moves back.
        if self.budget >= size {
            self.updated = self.updated.max(now);
            return;
        }
        let elapsed = now.saturating_duration_since(self.updated).as_nanos();
        let refill_ns = self.config.refill_ns();
        // On the request path: 64-bit arithmetic when it cannot overflow (a 128-bit
        // division costs several times a 64-bit one), else 128-bit.
        let tokens = match (u64::try_from(elapsed).ok())
            .and_then(|e| e.checked_mul(self.config.size))
            .zip(u64::try_from(refill_ns).ok())
        {
            Some((product, refill)) => u128::from(product / refill),
            None => elapsed * u128::from(self.config.size) / refill_ns,
        };
        if tokens == 0 {
            return;
        }
        let missing = (size - self.budget) as u128;
        if tokens >= missing {
            self.budget = size;
            self.updated = self.updated.max(now);
        } else {
            self.budget += tokens as i128;
            // The time `tokens` took, rounded up so the clock never runs ahead.
            let took = (tokens * refill_ns).div_ceil(u128::from(self.config.size));
            self.updated += Duration::from_nanos(took as u64);
        }
    }

    /// How long until `cost` tokens can be taken (zero: now). A cost above `size`
    /// can be taken once the bucket is full.
    pub fn wait_for(&mut self, cost: u64, now: Instant) -> Duration {
        self.refill(now);
        let need = i128::from(cost.min(self.config.size)) - i128::from(self.burst);
        if self.budget >= need {
            return Duration::ZERO;
        }
        let missing = (need - self.budget) as u128;
        let ns = (missing * self.config.refill_ns()).div_ceil(u128::from(self.config.size));
        // Minus what has accrued towards the next token since the last update.
        let accrued = now.saturating_duration_since(self.updated).as_nanos();
        Duration::from_nanos(ns.saturating_sub(accrued).max(1) as u64)
    }

    /// Takes `cost` tokens, the one-time burst first. Call after `wait_for` said zero.
    pub fn take(&mut self, cost: u64) {
        let from_burst = cost.min(self.burst);
        self.burst -= from_burst;
        self.budget -= i128::from(cost - from_burst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(size: u64, burst: u64, refill_ms: u64) -> (TokenBucket, Instant) {
        let now = Instant::now();
        let cfg = BucketConfig {
            size,
            one_time_burst: burst,
            refill_time_ms: refill_ms,
        };
        cfg.check().unwrap();
        (TokenBucket::new(cfg, now), now)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_full_bucket_gives_its_size_then_refills_at_its_rate() {
        // 100 tokens per 100 ms: 1000 per second.
        let (mut b, t0) = bucket(100, 0, 100);
        for _ in 0..100 {
            assert_eq!(b.wait_for(1, t0), Duration::ZERO);
            b.take(1);
        }
        // Empty: the next token takes 1 ms.
        assert_eq!(b.wait_for(1, t0), ms(1));
        assert_eq!(
            b.wait_for(1, t0 + Duration::from_micros(400)),
            Duration::from_micros(600)
        );
        // After 50 ms, 50 tokens are back, and no more.
        let t = t0 + ms(50);
        for _ in 0..50 {
            assert_eq!(b.wait_for(1, t), Duration::ZERO);
            b.take(1);
        }
        assert!(b.wait_for(1, t) > Duration::ZERO);
        // Never more than the size, however long it rests.
        let t = t0 + Duration::from_secs(10);
        let mut n = 0;
        while b.wait_for(1, t).is_zero() {
            b.take(1);
            n += 1;
        }
        assert_eq!(n, 100);
    }

    #[test]
    fn frequent_refills_lose_no_fraction_of_a_token() {
        let (mut b, t0) = bucket(1000, 0, 1000);
        b.take(1000);
        // Looked at every 0.3 ms for one second: 1000 tokens come back, no fewer.
        let mut t = t0;
        for _ in 0..3334 {
            t += Duration::from_micros(300);
            b.wait_for(1, t);
        }
        let mut n = 0;
        while b.wait_for(1, t).is_zero() {
            b.take(1);
            n += 1;
        }
        assert!((999..=1000).contains(&n), "{n} tokens after 1 s");
    }

    #[test]
    fn the_one_time_burst_is_spent_first_and_never_refilled() {
        let (mut b, t0) = bucket(10, 5, 100);
        let mut n = 0;
        while b.wait_for(1, t0).is_zero() {
            b.take(1);
            n += 1;
        }
        assert_eq!(n, 15);
        let t = t0 + Duration::from_secs(1);
        let mut n = 0;
        while b.wait_for(1, t).is_zero() {
            b.take(1);
            n += 1;
        }
        assert_eq!(n, 10, "only the bucket refills");
    }

    #[test]
    fn a_cost_above_the_size_goes_on_a_full_bucket_and_leaves_it_in_debt() {
        // 64 KiB per 100 ms; a 1 MiB read costs 16 refills.
        let (mut b, t0) = bucket(64 << 10, 0, 100);
        assert_eq!(b.wait_for(1 << 20, t0), Duration::ZERO);
        b.take(1 << 20);
        // The debt is 15 refills, then the next 4 KiB needs 1/16 more.
        let wait = b.wait_for(4096, t0);
        assert_eq!(wait, ms(1500) + Duration::from_micros(6250));
        assert!(b.wait_for(4096, t0 + wait).is_zero());
    }

    #[test]
    fn a_stale_time_never_moves_the_bucket_clock_back() {
        // Another queue's thread updated the bucket at t0 + 50 ms; this one passes
        // the clock read that ended its own previous request, at t0 + 10 ms.
        let (mut b, t0) = bucket(10, 0, 100);
        assert!(b.wait_for(1, t0 + ms(50)).is_zero());
        b.wait_for(1, t0 + ms(10));
        b.take(10);
        // Had the clock gone back to t0 + 10 ms, 40 ms would count twice: 4 tokens.
        let mut n = 0;
        while b.wait_for(1, t0 + ms(50)).is_zero() {
            b.take(1);
            n += 1;
        }
        assert_eq!(n, 0, "no time has passed since t0 + 50 ms");
    }

    #[test]
    fn bad_parameters_are_refused() {
        let cfg = |size, refill_time_ms| BucketConfig {
            size,
            one_time_burst: 0,
            refill_time_ms,
        };
        assert!(cfg(0, 100).check().is_err());
        assert!(cfg(100, 0).check().is_err());
        assert!(cfg(u64::MAX, 100).check().is_err());
        assert!(cfg(100, u64::MAX).check().is_err());
        // The largest accepted bucket, at its longest wait, computes.
        let (mut b, t0) = bucket(1 << 48, 0, 1 << 32);
        b.take(1 << 48);
        assert!(b.wait_for(1 << 48, t0) > Duration::ZERO);
    }
}
