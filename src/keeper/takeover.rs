//! A new serving process takes over from the keeper's: after a crash under the
//! frontend's session (from the journal the dead one left, on the same rings), or
//! while none is connected (a fresh one, unless that makes a crash loop:
//! `crash.rs`); for an upgrade (SIGHUP or `PUT /upgrade`: `upgrade.rs`'s hand-over);
//! when the frontend hands back the session region of an earlier daemon
//! (`handback.rs`). When it cannot, the error says why: after a failed upgrade the
//! old process serves on, a region that cannot be served on leaves the fresh
//! session, and a crash not recovered ends the keeper.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::Ordering;

use log::{info, warn};
use nix::sys::signal::Signal;

use super::crash::{Ending, CRASH_LOOP, QUICK};
use super::event_loop::Keeper;
use super::relay::Relay;
use super::replay;
use super::serving::{pidfd_of, reap, Spawned};
use super::upgrade::{self, Command, STEP_TIMEOUT};
use super::Error;
use crate::region::{PauseKind, Region};

impl Keeper<'_> {
    /// The serving process ended: the keeper ends too, or starts a new one in its
    /// place: one that takes over the guest's session on the same rings after a
    /// crash under it, or a fresh one while the keeper waits for a frontend.
    pub(super) fn on_end(&mut self, how: Ending, waiting: bool, relay: &mut Option<Relay>) {
        let code = match how {
            Ending::Exited(code) => code,
            Ending::Killed(_) => 1,
        };
        let died_at = self
            .backend_gone
            .take()
            .unwrap_or_else(std::time::Instant::now);
        if !how.is_crash() {
            self.exit(code);
        }
        if relay.is_none() && !waiting {
            // Its frontend left without --keep-serving: it was ending anyway.
            eprintln!("volfsd: keeper: the serving process {how} after its frontend left");
            self.exit(code);
        }
        let loops = self.crashes.record(std::time::Instant::now(), self.started);
        self.region
            .header()
            .counters
            .crashes
            .store(self.crashes.total(), Ordering::Relaxed);
        if loops {
            eprintln!(
                "volfsd: keeper: the serving process {how}: {CRASH_LOOP} crashes in a row, \
                 each within {} s of its start: a crash loop: ending",
                QUICK.as_secs()
            );
            self.exit(code);
        }
        let old = self.child;
        let with_session = relay.is_some();
        let replaced = match relay.as_mut() {
            Some(r) => self.recover(r, died_at).map(Some),
            None => self.replace().map(|()| None),
        };
        let tally = format!(
            "crash {}, {} in a row",
            self.crashes.total(),
            self.crashes.in_a_row()
        );
        match replaced {
            Ok(Some(pause)) => warn!(
                "keeper: the serving process {old} {how} under the guest's session; serving \
                 process {} took over its rings and the guest's session (the guest waited \
                 {} ms; {tally})",
                self.child,
                pause.as_millis()
            ),
            Ok(None) => warn!(
                "keeper: the serving process {old} {how}; serving process {} took its \
                 place ({tally})",
                self.child
            ),
            Err(e) if with_session => {
                self.fail(&format!("the serving process {how}, with the frontend's session: the guest's session could not be taken over: {e}"))
            }
            Err(e) => self.fail(&format!("the serving process {how}; starting another: {e}")),
        }
    }

    /// After a crash under the guest's session: a new serving process serves the
    /// guest on from the journal the dead one left, on the same rings, which the
    /// keeper sets up in it as the frontend did; the requests the dead one had
    /// taken are answered there. The frontend sees no disconnect. The guest's pause
    /// counts from `died_at` to the rings running again.
    fn recover(
        &mut self,
        relay: &mut Relay,
        died_at: std::time::Instant,
    ) -> Result<std::time::Duration, Error> {
        if let Some(why) = relay.setup().unreplayable {
            return Err(Error::Unreplayable(why));
        }
        let from = self.region.header().current();
        let mut new = self.spawn(from.other(), Some(from), true, None, None)?;
        let stream = new.stream.take().expect("connected");
        let set_up = replay::ready(&stream, STEP_TIMEOUT)
            .and_then(|()| {
                replay::set_up(&stream, relay.setup(), &Default::default(), STEP_TIMEOUT)
            })
            .and_then(|()| replay::run(&stream, &replay::start(relay.setup()), STEP_TIMEOUT));
        if let Err(e) = set_up {
            return Err(new.give_up(stream, e));
        }
        replay::nudge(relay.setup());
        drop(relay.switch(stream));
        self.adopt(new);
        let pause = died_at.elapsed();
        let c = &self.region.header().counters;
        c.recoveries.fetch_add(1, Ordering::Relaxed);
        c.add_pause(PauseKind::Recovery, pause);
        // The frontend's message the dead process did not answer, if one.
        if let Err(e) = relay.resend_unanswered() {
            warn!("keeper: the frontend's message the dead process did not answer: {e}");
        }
        Ok(pause)
    }

    /// The frontend handed back a session region not this keeper's
    /// (`SET_INFLIGHT_FD`, cloud-hypervisor's reconnect after the whole daemon was
    /// restarted: handback.rs). One with a guest's session in it is served on;
    /// anything else leaves the fresh session as it is. Acked either way: the
    /// frontend goes on setting the rings up.
    pub(super) fn handed_back(&mut self, relay: &mut Relay) {
        let Some((msg, fd)) = relay.take_handed_back() else {
            return;
        };
        let t0 = std::time::Instant::now();
        match self.resume_region(relay, fd) {
            Ok(true) => {
                relay.nudge_when_enabled();
                warn!(
                    "keeper: the frontend handed back the session region of an earlier daemon \
                     (SET_INFLIGHT_FD): serving process {} took over the guest's session \
                     from it ({} ms; the rings start as the frontend sets them up)",
                    self.child,
                    t0.elapsed().as_millis()
                )
            }
            Ok(false) => info!(
                "keeper: the frontend handed back a session region with no session in it: \
                 a fresh session"
            ),
            Err(e) => warn!(
                "keeper: the frontend handed back a session region (SET_INFLIGHT_FD) that \
                 cannot be served on: {e}; a fresh session (the guest's requests in flight \
                 then are not answered)"
            ),
        }
        if let Err(e) = relay.ack(&msg) {
            warn!("keeper: acking SET_INFLIGHT_FD: {e}");
        }
    }

    /// Adopts the region `fd` if it holds a session: a new serving process loads the
    /// session from its journal, is set up as the frontend has set this one up so
    /// far, and serves in place of the fresh one. Ok(false): no session in it.
    fn resume_region(&mut self, relay: &mut Relay, fd: OwnedFd) -> Result<bool, Error> {
        let region = Region::open(fd).map_err(|source| Error::Region {
            step: "mapping it",
            source,
        })?;
        if !region.header().in_session() {
            return Ok(false);
        }
        if let Some(why) = relay.setup().unreplayable {
            return Err(Error::Unreplayable(why));
        }
        // The volumes stay this daemon's own (its command line, and what its control
        // socket attached since it started): the region's list is untrusted and is
        // replaced by ours before any process reads it. Volumes the guest held that
        // this daemon does not have are named when the journal is loaded
        // (fs/session_load.rs); their files answer ESTALE.
        let own = self.region.volumes();
        let refused = names_not_in(region.volumes().as_deref(), own.as_deref().unwrap_or("[]"));
        if !refused.is_empty() {
            warn!(
                "keeper: the session region handed back lists volumes this daemon was not \
                 given: {refused:?}; not attached (it serves its own volumes)"
            );
        }
        match &own {
            Some(own) => region.set_volumes(own).map_err(|source| Error::Region {
                step: "replacing its list of volumes with this daemon's",
                source,
            })?,
            None => region.forget_volumes(),
        }
        let ours = std::mem::replace(&mut self.region, region);
        let from = self.region.header().current();
        let set_up = self
            .spawn(from.other(), Some(from), true, None, None)
            .and_then(|mut new| {
                let stream = new.stream.take().expect("connected");
                let done = replay::ready(&stream, STEP_TIMEOUT).and_then(|()| {
                    replay::set_up(&stream, relay.setup(), &Default::default(), STEP_TIMEOUT)
                });
                match done {
                    Ok(()) => Ok((new, stream)),
                    Err(e) => Err(new.give_up(stream, e)),
                }
            });
        let (new, stream) = match set_up {
            Ok(v) => v,
            Err(e) => {
                self.region = ours;
                return Err(e);
            }
        };
        let fresh = self.child;
        drop(relay.switch(stream));
        match self.region.fd().try_clone_to_owned() {
            Ok(fd) => relay.set_region(fd),
            Err(e) => warn!("keeper: no inflight fd for the frontend: {e}"),
        }
        self.adopt(new);
        // The fresh process served nothing; its region is gone with `ours`. It is
        // reaped before the takeover is told: until then it still accepted on the
        // control socket beside its successor, and answered a client for volumes it
        // did not have (in namespace mode the keeper's child is its supervisor, whose
        // death kills the serving process below it: both are gone once it is reaped).
        let _ = nix::sys::signal::kill(fresh, Signal::SIGKILL);
        reap(fresh);
        drop(ours);
        let c = &self.region.header().counters;
        c.crashes.fetch_add(1, Ordering::Relaxed);
        c.recoveries.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// SIGHUP or the channel: a new serving process takes over (upgrade.rs), or
    /// the old one serves on and the error says why. [`Keeper::finish`] completes it.
    pub(super) fn upgrade(
        &self,
        relay: Option<&mut Relay>,
        binary: Option<&Path>,
    ) -> Result<Pending, Error> {
        let Some(relay) = relay else {
            return Err(Error::NoFrontend);
        };
        let command = match (binary, &self.command) {
            (Some(b), Some(c)) => Some(c.with_binary(b).map_err(Error::Binary)?),
            (Some(_), None) => return Err(Error::NoBinary),
            (None, _) => None,
        };
        let half = self.region.header().current().other();
        // The new process takes the guest's lock files only from the one it replaces.
        let source = pidfd_of(self.child)
            .map_err(|e| warn!("keeper: no pidfd of serving process {}: {e}", self.child))
            .ok();
        let mut new = self.spawn(half, None, true, command.as_ref(), source.as_ref())?;
        let stream = new.stream.take().expect("connected");
        match upgrade::hand_over(relay, stream) {
            Ok(done) => Ok(Pending {
                new,
                old: done.old,
                pause: done.pause,
                command,
            }),
            Err((e, stream)) => Err(new.give_up(stream, e)),
        }
    }

    /// Logs an upgrade's outcome and, when it succeeded, lets the old process go:
    /// its frontend gone, it exits (with --keep-serving it would wait for the next
    /// one: told to go).
    pub(super) fn finish(&mut self, outcome: Result<Pending, Error>) {
        let counters = &self.region.header().counters;
        let done = match outcome {
            Ok(done) => done,
            Err(why) => {
                counters.upgrades_failed.fetch_add(1, Ordering::Relaxed);
                return warn!(
                    "keeper: upgrade failed, serving process {} serves on: {why}",
                    self.child
                );
            }
        };
        info!(
            "keeper: upgraded: serving process {} took over from {} (the guest waited {} ms)",
            done.new.pid,
            self.child,
            done.pause.as_millis()
        );
        counters.upgrades.fetch_add(1, Ordering::Relaxed);
        counters.add_pause(PauseKind::Upgrade, done.pause);
        drop(done.old);
        let _ = nix::sys::signal::kill(self.child, Signal::SIGTERM);
        if let Some(c) = done.command {
            info!(
                "keeper: the daemon's binary is {} from now on",
                c.binary.display()
            );
            self.command = Some(c);
        }
        self.adopt(done.new);
    }
}

/// An upgrade done but for letting the old process go.
pub(super) struct Pending {
    pub(super) new: Spawned,
    pub(super) old: UnixStream,
    pub(super) pause: std::time::Duration,
    /// The binary named for it (`ctl upgrade --binary`): the daemon's from now on.
    pub(super) command: Option<Command>,
}

/// The names in the volume list `listed` (the control API's JSON, untrusted) that
/// `own` (this daemon's list) does not have.
fn names_not_in(listed: Option<&str>, own: &str) -> Vec<String> {
    let names = |json: &str| -> Vec<String> {
        match serde_json::from_str::<serde_json::Value>(json) {
            Ok(serde_json::Value::Array(list)) => list
                .iter()
                .filter_map(|v| v["name"].as_str().map(String::from))
                .collect(),
            _ => Vec::new(),
        }
    };
    let own = names(own);
    listed
        .map(names)
        .unwrap_or_default()
        .into_iter()
        .filter(|n| !own.contains(n))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, AsRawFd};

    use super::*;
    use crate::keeper::testing::{keeper, relay};
    use crate::keeper::upgrade::Refusal;

    #[test]
    fn an_upgrade_with_no_frontend_is_refused_and_counted() {
        let mut k = keeper(Some("exit 0"));
        let before = k.keeper.child;
        let e = k.keeper.upgrade(None, None).err().unwrap();
        assert!(matches!(e, Error::NoFrontend));
        assert_eq!(
            e.to_string(),
            "no frontend is connected (nothing to hand over)"
        );
        k.keeper.finish(Err(e));
        let c = &k.keeper.region.header().counters;
        assert_eq!(c.upgrades_failed.load(Ordering::Relaxed), 1);
        assert_eq!(c.upgrades.load(Ordering::Relaxed), 0);
        assert_eq!(k.keeper.child, before, "the old process serves on");
    }

    #[test]
    fn an_upgrade_to_a_binary_not_run_starts_nothing() {
        let mut k = keeper(Some("exit 0"));
        let (mut r, _vmm, _serving) = relay();
        let e = k
            .keeper
            .upgrade(Some(&mut r), Some(Path::new("v2/volfsd")))
            .err()
            .unwrap();
        assert!(matches!(e, Error::Binary(Refusal::Relative(_))), "{e:?}");
        assert_eq!(e.to_string(), "--binary v2/volfsd: not an absolute path");
        k.keeper.command = None;
        let e = k
            .keeper
            .upgrade(Some(&mut r), Some(Path::new("/usr/bin/volfsd")))
            .err()
            .unwrap();
        assert!(matches!(e, Error::NoBinary), "{e:?}");
    }

    #[test]
    fn a_new_process_that_exits_at_once_fails_the_upgrade_with_its_status() {
        let k = keeper(Some("exit 3"));
        let before = k.keeper.child;
        let (mut r, _vmm, _serving) = relay();
        let e = k.keeper.upgrade(Some(&mut r), None).err().unwrap();
        assert!(
            matches!(
                e,
                Error::GaveUp {
                    ending: Some(Ending::Exited(3)),
                    ..
                }
            ),
            "{e:?}"
        );
        // The words `ctl upgrade` and the log show (harness/tests/upgradable.rs).
        assert!(
            e.to_string()
                .ends_with(" (the new serving process exited with status 3)"),
            "{e}"
        );
        assert_eq!(k.keeper.child, before);
        assert_eq!(k.keeper.region.header().current(), crate::region::Half::A);
    }

    #[test]
    fn a_crash_not_taken_over_says_why_and_changes_nothing() {
        let mut k = keeper(Some("exit 3"));
        let before = k.keeper.child;
        let (mut r, _vmm, _serving) = relay();
        let e = k
            .keeper
            .recover(&mut r, std::time::Instant::now())
            .err()
            .unwrap();
        assert!(
            matches!(
                e,
                Error::GaveUp {
                    ending: Some(Ending::Exited(3)),
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(k.keeper.child, before);
        let c = &k.keeper.region.header().counters;
        assert_eq!(c.recoveries.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_region_handed_back_is_served_on_only_if_it_holds_a_session() {
        let mut k = keeper(Some("exit 3"));
        let (mut r, _vmm, _serving) = relay();
        // Not a region: a memfd not sealed.
        let memfd = nix::sys::memfd::memfd_create(
            c"not-a-region",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
        )
        .unwrap();
        let e = k.keeper.resume_region(&mut r, memfd).err().unwrap();
        assert!(
            matches!(
                e,
                Error::Region {
                    step: "mapping it",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string().starts_with("mapping it: session region: "),
            "{e}"
        );
        // A region with no session in it: the fresh session stays.
        let empty = Region::create().unwrap();
        let fd = empty.fd().as_fd().try_clone_to_owned().unwrap();
        assert!(!k.keeper.resume_region(&mut r, fd).unwrap());
        // One in session, whose new serving process exits at once: the keeper's
        // own region is kept.
        let ours = k.keeper.region.fd().as_raw_fd();
        let held = Region::create().unwrap();
        held.header().set_in_session(true);
        let fd = held.fd().as_fd().try_clone_to_owned().unwrap();
        let e = k.keeper.resume_region(&mut r, fd).err().unwrap();
        assert!(
            matches!(
                e,
                Error::GaveUp {
                    ending: Some(Ending::Exited(3)),
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(k.keeper.region.fd().as_raw_fd(), ours);
    }

    #[test]
    fn a_handed_back_list_is_named_where_it_has_what_this_daemon_does_not() {
        let own = r#"[{"name":"a","volume":{"path":"a"}}]"#;
        let listed = r#"[{"name":"a"},{"name":"secret"},{"nameless":1}]"#;
        assert_eq!(names_not_in(Some(listed), own), ["secret"]);
        assert!(names_not_in(Some("not json"), own).is_empty());
        assert!(names_not_in(None, own).is_empty());
        assert_eq!(names_not_in(Some(listed), "[]"), ["a", "secret"]);
    }
}
