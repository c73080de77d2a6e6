//! The byte ranges one lock owner holds on one file, as POSIX record locks combine
//! them: a new lock replaces whatever the owner held over its range (splitting what
//! it overlaps), an unlock removes the range. The kernel keeps the real locks; this
//! copy exists so that the device state can name them (the kernel tells no one which
//! ranges an open file description holds).

/// A held range: `start..=end` (`end` is `i64::MAX` for "to the end of the file"),
/// of kind `F_RDLCK` or `F_WRLCK`.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct HeldRange {
    pub start: u64,
    pub end: u64,
    pub kind: i32,
}

/// One owner's ranges, sorted by start, never overlapping.
#[derive(Clone, Debug, Default, Eq, PartialEq)]
pub struct LockRanges {
    ranges: Vec<HeldRange>,
}

impl LockRanges {
    /// Applies a granted lock or an unlock (`F_UNLCK`) of `start..=end`.
    pub fn apply(&mut self, start: u64, end: u64, kind: i32) {
        if end < start {
            return;
        }
        let mut kept = Vec::with_capacity(self.ranges.len() + 2);
        for r in self.ranges.drain(..) {
            if r.end < start || r.start > end {
                kept.push(r);
                continue;
            }
            // The parts of `r` outside the new range stay as they were.
            if r.start < start {
                kept.push(HeldRange {
                    end: start - 1,
                    ..r
                });
            }
            if r.end > end {
                kept.push(HeldRange {
                    start: end + 1,
                    ..r
                });
            }
        }
        if kind != libc::F_UNLCK {
            kept.push(HeldRange { start, end, kind });
        }
        kept.sort_unstable_by_key(|r| r.start);
        self.ranges = kept;
    }

    pub fn ranges(&self) -> &[HeldRange] {
        &self.ranges
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RD: i32 = libc::F_RDLCK;
    const WR: i32 = libc::F_WRLCK;
    const UN: i32 = libc::F_UNLCK;
    const EOF: u64 = i64::MAX as u64;

    fn held(l: &LockRanges) -> Vec<(u64, u64, i32)> {
        l.ranges()
            .iter()
            .map(|r| (r.start, r.end, r.kind))
            .collect()
    }

    #[test]
    fn locks_split_replace_and_unlock_as_posix_does() {
        let mut l = LockRanges::default();
        l.apply(0, EOF, WR);
        assert_eq!(held(&l), [(0, EOF, WR)]);
        // A read lock in the middle splits the write lock in three.
        l.apply(10, 19, RD);
        assert_eq!(held(&l), [(0, 9, WR), (10, 19, RD), (20, EOF, WR)]);
        // Unlocking across two parts trims both.
        l.apply(5, 14, UN);
        assert_eq!(held(&l), [(0, 4, WR), (15, 19, RD), (20, EOF, WR)]);
        // Unlocking everything leaves nothing.
        l.apply(0, EOF, UN);
        assert!(l.is_empty());
    }

    #[test]
    fn a_backwards_range_changes_nothing() {
        let mut l = LockRanges::default();
        l.apply(5, 9, WR);
        l.apply(9, 5, UN);
        assert_eq!(held(&l), [(5, 9, WR)]);
    }
}
