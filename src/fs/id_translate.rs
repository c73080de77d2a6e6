//! `--translate-uid` / `--translate-gid`: uids and gids translated between guest and
//! host by the daemon itself, with virtiofsd's rules and spelling
//! (`TYPE:SOURCE:TARGET:COUNT`, `forbid-guest:SOURCE:COUNT`):
//! - `guest:G:H:N`: guest ids G..G+N are host ids H..H+N (guest to host only);
//! - `host:H:G:N`: host ids H..H+N are shown to the guest as G..G+N;
//! - `squash-guest:G:H:N`: guest ids G..G+N all become host id H;
//! - `squash-host:H:G:N`: host ids H..H+N are all shown as guest id G;
//! - `forbid-guest:G:N`: a guest id in G..G+N may not own anything: creating a file as
//!   one, or giving a file one, fails with EPERM;
//! - `map:G:H:N`: both `guest:G:H:N` and `host:H:G:N`.
//!
//! An id no rule covers is itself. Ranges of one direction may not overlap; a count
//! of 0 is an empty range (Incus writes `forbid-guest:0:0`). Guest to host applies to
//! the ids files are created with and to chown; host to guest to every attribute the
//! guest reads. A few rules per share: a linear scan beats a tree.

use std::fmt;
use std::io;

/// Where the ids of one range go.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
enum Target {
    /// `start + (id - from)`.
    Base(u32),
    /// One id for the whole range.
    Squash(u32),
    /// Refused (guest to host only).
    Forbid,
}

#[derive(Clone, Copy, Debug, Eq, PartialEq)]
struct Range {
    from: u64,
    end: u64,
    to: Target,
}

/// The rules for one kind of id (uids or gids).
#[derive(Clone, Debug, Default, Eq, PartialEq)]
pub struct IdTranslation {
    guest_to_host: Vec<Range>,
    host_to_guest: Vec<Range>,
}

/// Which kind of id a translation is for, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdKind {
    Uid,
    Gid,
}

impl fmt::Display for IdKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdKind::Uid => "--translate-uid",
            IdKind::Gid => "--translate-gid",
        })
    }
}

/// A `--translate-uid`/`--translate-gid` rule refused: the flag, the rule, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdRuleError {
    pub kind: IdKind,
    pub rule: String,
    pub why: RuleProblem,
}

/// What is wrong with a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleProblem {
    NoType,
    NotANumber(String),
    Arity {
        kind: String,
        want: usize,
        got: usize,
    },
    PastLargestId,
    Overlaps {
        from: u64,
        end: u64,
    },
    UnknownType(String),
}

impl fmt::Display for RuleProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleProblem::NoType => write!(f, "expected TYPE:SOURCE:TARGET:COUNT"),
            RuleProblem::NotANumber(n) => write!(f, "'{n}' is not an id or count"),
            RuleProblem::Arity { kind, want, got } => {
                write!(f, "{kind} takes {want} numbers, not {got}")
            }
            RuleProblem::PastLargestId => write!(f, "the range goes past the largest id"),
            RuleProblem::Overlaps { from, end } => {
                write!(f, "overlaps the ids {from}..{end} of an earlier rule")
            }
            RuleProblem::UnknownType(other) => write!(
                f,
                "unknown type '{other}' (guest, host, squash-guest, squash-host, forbid-guest, map)"
            ),
        }
    }
}

impl fmt::Display for IdRuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.kind, self.rule, self.why)
    }
}

impl std::error::Error for IdRuleError {}

impl IdTranslation {
    /// Parses the rules as given on the command line, in order.
    pub fn parse(kind: IdKind, rules: &[String]) -> Result<Self, IdRuleError> {
        let mut t = IdTranslation::default();
        for rule in rules {
            t.add(rule).map_err(|why| IdRuleError {
                kind,
                rule: rule.clone(),
                why,
            })?;
        }
        Ok(t)
    }

    fn add(&mut self, rule: &str) -> Result<(), RuleProblem> {
        let (kind, rest) = rule.split_once(':').ok_or(RuleProblem::NoType)?;
        let nums = rest
            .split(':')
            .map(|n| {
                n.parse::<u32>()
                    .map_err(|_| RuleProblem::NotANumber(n.to_string()))
            })
            .collect::<Result<Vec<u32>, RuleProblem>>()?;
        let want = if kind == "forbid-guest" { 2 } else { 3 };
        if nums.len() != want {
            return Err(RuleProblem::Arity {
                kind: kind.to_string(),
                want,
                got: nums.len(),
            });
        }
        let range = |from: u32, count: u32, to: Target| -> Result<Range, RuleProblem> {
            let end = u64::from(from) + u64::from(count);
            if end > u64::from(u32::MAX) + 1 {
                return Err(RuleProblem::PastLargestId);
            }
            Ok(Range {
                from: from.into(),
                end,
                to,
            })
        };
        let (a, b) = (nums[0], nums[1]);
        match kind {
            "guest" => push(&mut self.guest_to_host, range(a, nums[2], Target::Base(b))?),
            "host" => push(&mut self.host_to_guest, range(a, nums[2], Target::Base(b))?),
            "squash-guest" => push(
                &mut self.guest_to_host,
                range(a, nums[2], Target::Squash(b))?,
            ),
            "squash-host" => push(
                &mut self.host_to_guest,
                range(a, nums[2], Target::Squash(b))?,
            ),
            "forbid-guest" => push(&mut self.guest_to_host, range(a, b, Target::Forbid)?),
            "map" => {
                push(&mut self.guest_to_host, range(a, nums[2], Target::Base(b))?)?;
                push(&mut self.host_to_guest, range(b, nums[2], Target::Base(a))?)
            }
            other => Err(RuleProblem::UnknownType(other.to_string())),
        }
    }

    /// No rule at all: every id is itself.
    pub fn is_identity(&self) -> bool {
        self.guest_to_host.is_empty() && self.host_to_guest.is_empty()
    }

    /// The host id a guest id stands for; EPERM for a forbidden one.
    pub fn to_host(&self, guest: u32) -> io::Result<u32> {
        match apply(&self.guest_to_host, guest) {
            Some(id) => Ok(id),
            None => Err(io::Error::from_raw_os_error(libc::EPERM)),
        }
    }

    /// The guest id a host id is shown as.
    pub fn to_guest(&self, host: u32) -> u32 {
        // Host-to-guest rules have no Forbid.
        apply(&self.host_to_guest, host).unwrap_or(host)
    }
}

fn push(ranges: &mut Vec<Range>, r: Range) -> Result<(), RuleProblem> {
    if r.from == r.end {
        return Ok(());
    }
    if let Some(o) = ranges.iter().find(|o| o.from < r.end && r.from < o.end) {
        return Err(RuleProblem::Overlaps {
            from: o.from,
            end: o.end,
        });
    }
    ranges.push(r);
    Ok(())
}

/// None: forbidden.
fn apply(ranges: &[Range], id: u32) -> Option<u32> {
    let x = u64::from(id);
    match ranges.iter().find(|r| r.from <= x && x < r.end) {
        None => Some(id),
        Some(r) => match r.to {
            Target::Base(base) => Some((u64::from(base) + (x - r.from)) as u32),
            Target::Squash(to) => Some(to),
            Target::Forbid => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(rules: &[&str]) -> IdTranslation {
        let rules: Vec<String> = rules.iter().map(|s| s.to_string()).collect();
        IdTranslation::parse(IdKind::Uid, &rules).unwrap()
    }

    #[test]
    fn map_is_both_ways_and_the_rest_is_identity() {
        let m = t(&["map:0:1000:10"]);
        assert_eq!(m.to_host(0).unwrap(), 1000);
        assert_eq!(m.to_host(9).unwrap(), 1009);
        assert_eq!(m.to_host(10).unwrap(), 10);
        assert_eq!(m.to_guest(1005), 5);
        assert_eq!(m.to_guest(5), 5);
        assert!(!m.is_identity() && t(&[]).is_identity());
    }

    #[test]
    fn squash_and_one_way_rules() {
        // virtiofsd's README example: every guest id squashed to the daemon's user,
        // which the guest sees as 1000.
        let m = t(&["squash-guest:0:1001:4294967295", "host:1001:1000:1"]);
        assert_eq!(m.to_host(0).unwrap(), 1001);
        assert_eq!(m.to_host(4_000_000_000).unwrap(), 1001);
        assert_eq!(m.to_guest(1001), 1000);
        assert_eq!(m.to_guest(0), 0);
        let s = t(&["squash-host:0:65534:100"]);
        assert_eq!(s.to_guest(42), 65534);
        assert_eq!(t(&["guest:5:50:1"]).to_guest(50), 50);
    }

    #[test]
    fn incus_idmap_rules() {
        // Incus: guest root is host uid 1000, every other guest id is forbidden;
        // `forbid-guest:0:0` is an empty range.
        let m = t(&[
            "map:0:1000:1",
            "forbid-guest:0:0",
            "forbid-guest:1:4294967294",
        ]);
        assert_eq!(m.to_host(0).unwrap(), 1000);
        assert_eq!(m.to_host(1).unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert_eq!(
            m.to_host(u32::MAX - 1).unwrap_err().raw_os_error(),
            Some(libc::EPERM)
        );
        assert_eq!(m.to_host(u32::MAX).unwrap(), u32::MAX);
        assert_eq!(m.to_guest(1000), 0);
    }

    #[test]
    fn bad_rules_are_named() {
        let e = |r: &str| {
            IdTranslation::parse(IdKind::Gid, &[r.to_string()])
                .unwrap_err()
                .to_string()
        };
        assert!(e("teleport:1:2:3").contains("--translate-gid teleport:1:2:3: unknown type"));
        assert!(e("map:1:2").contains("takes 3 numbers"));
        assert!(e("forbid-guest:1:2:3").contains("takes 2 numbers"));
        assert!(e("map:x:2:3").contains("'x'"));
        assert!(e("map:4294967295:0:2").contains("past the largest id"));
        let rules = ["map:0:1000:10".to_string(), "guest:5:7:1".to_string()];
        let e = IdTranslation::parse(IdKind::Uid, &rules).unwrap_err();
        assert_eq!(e.kind, IdKind::Uid);
        assert_eq!(e.rule, "guest:5:7:1");
        assert_eq!(e.why, RuleProblem::Overlaps { from: 0, end: 10 });
        assert!(e.to_string().contains("overlaps"), "{e}");
    }
}
