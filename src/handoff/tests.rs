//! The hand-over's unit tests: entries, offers, peers, deadlines.

use super::*;

#[test]
fn entries_round_trip_and_unknown_kinds_are_refused() {
    for e in [
        Entry::LockFile {
            node: 7,
            owner: u64::MAX,
        },
        Entry::FlockHandle { handle: 3 },
    ] {
        let mut b = Vec::new();
        e.encode(&mut b);
        assert_eq!(b.len(), ENTRY_LEN);
        assert_eq!(Entry::decode(&b), Some(e));
    }
    assert_eq!(Entry::decode(&[9; ENTRY_LEN]), None);
    assert_eq!(Entry::decode(&[1; 5]), None);
}

#[test]
fn a_destination_with_the_token_gets_the_files_and_one_without_gets_nothing() {
    let source = Handoff::prepare().unwrap();
    let files: Vec<(Entry, OwnedFd)> = (0..450)
        .map(|i| {
            let f = std::fs::File::open("/proc/self/stat").unwrap();
            (Entry::FlockHandle { handle: i }, OwnedFd::from(f))
        })
        .collect();
    let offer = source.offer(files).unwrap().expect("an offer");
    // Another daemon of this host, with the wrong token first.
    let wrong = Handoff::prepare().unwrap();
    let mut bad = offer.clone();
    bad.token[0] ^= 1;
    assert!(wrong.fetch(&bad).is_err());
    let dest = Handoff::prepare().unwrap();
    let got = dest.fetch(&offer).unwrap();
    assert_eq!(got.len(), 450);
    assert_eq!(got[449].0, Entry::FlockHandle { handle: 449 });
    // Its socket is spent; another boot gets nothing.
    assert!(dest.fetch(&offer).is_err());
    let elsewhere = format::Handoff {
        boot_id: "another".into(),
        ..offer
    };
    assert!(Handoff::prepare().unwrap().fetch(&elsewhere).is_err());
}

fn pidfd(pid: libc::pid_t) -> OwnedFd {
    // SAFETY: pidfd_open with a pid and no flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    assert!(fd >= 0, "pidfd_open: {}", io::Error::last_os_error());
    // SAFETY: a new fd nobody else owns.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

#[test]
fn under_a_keeper_only_the_process_it_named_is_a_source() {
    let source = Handoff::prepare().unwrap();
    let files: Vec<(Entry, OwnedFd)> = (0..2)
        .map(|i| {
            let f = std::fs::File::open("/proc/self/stat").unwrap();
            (Entry::FlockHandle { handle: i }, OwnedFd::from(f))
        })
        .collect();
    let offer = source.offer(files).unwrap().expect("an offer");
    // Another process (a child that waits): not the one that serves the socket.
    let mut other = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let wrong = Handoff::prepare().unwrap();
    wrong.expect_source(pidfd(other.id() as libc::pid_t));
    let got = wrong.fetch(&offer);
    let _ = other.kill();
    let _ = other.wait();
    // Kernels before 6.5 (no SO_PEERPIDFD) or 6.9 (no pidfs) cannot tell.
    let ino = |f: &OwnedFd| {
        // SAFETY: plain data; fstat64 fills it for an fd we own.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        unsafe { libc::fstat64(f.as_raw_fd(), &mut st) };
        st.st_ino
    };
    // SAFETY: getpid cannot fail.
    let pidfs = ino(&pidfd(unsafe { libc::getpid() })) != ino(&pidfd(1));
    if pidfs {
        assert!(
            matches!(got, Err(HandoffError::WrongProcess { .. })),
            "{got:?}"
        );
    }
    // This process serves the socket: it is the source the keeper named.
    let right = Handoff::prepare().unwrap();
    // SAFETY: getpid cannot fail.
    right.expect_source(pidfd(unsafe { libc::getpid() }));
    assert_eq!(right.fetch(&offer).unwrap().len(), 2);
}

/// `--keep-serving` under cloud-hypervisor's local migrations: the daemon loads
/// the states it saved itself, again and again; its client socket serves one
/// load only, so its own offer is taken without it, each time.
#[test]
fn a_daemon_takes_its_own_offer_every_time_without_its_socket() {
    let me = Handoff::prepare().unwrap();
    for round in 0..3u64 {
        let files: Vec<(Entry, OwnedFd)> = (0..2)
            .map(|i| {
                let f = std::fs::File::open("/proc/self/stat").unwrap();
                (
                    Entry::FlockHandle {
                        handle: round * 10 + i,
                    },
                    OwnedFd::from(f),
                )
            })
            .collect();
        let offer = me.offer(files).unwrap().expect("an offer");
        let mut bad = offer.clone();
        bad.token[0] ^= 1;
        assert!(me.fetch(&bad).is_err(), "round {round}: a wrong token");
        let got = me.fetch(&offer).unwrap();
        assert_eq!(got.len(), 2, "round {round}");
        assert_eq!(
            got[1].0,
            Entry::FlockHandle {
                handle: round * 10 + 1
            }
        );
        me.withdraw();
        assert!(me.fetch(&offer).is_err(), "round {round}: withdrawn");
    }
    // Its client socket is still unused: a destination that is another daemon
    // would still be fetched from.
    assert!(me.client.lock().unwrap().is_some());
}

#[test]
fn a_peer_of_another_uid_with_the_token_gets_nothing_and_the_offer_stays() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: taking another uid needs root");
        return;
    }
    let source = Handoff::prepare().unwrap();
    let files: Vec<(Entry, OwnedFd)> = (0..3)
        .map(|i| {
            let f = std::fs::File::open("/proc/self/stat").unwrap();
            (Entry::FlockHandle { handle: i }, OwnedFd::from(f))
        })
        .collect();
    let offer = source.offer(files).unwrap().expect("an offer");
    // A process of another user on this host that knows the socket and the
    // token: only the uid check stands in its way.
    let foreign = Handoff::prepare().unwrap();
    let stolen = offer.clone();
    let got = std::thread::spawn(move || {
        // SAFETY: the raw system call changes this thread's credentials only
        // (glibc's setresuid would change every thread's); the thread ends here.
        let r = unsafe { libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534) };
        assert_eq!(r, 0, "setresuid: {}", std::io::Error::last_os_error());
        foreign.fetch(&stolen).map(|f| f.len())
    })
    .join()
    .unwrap();
    assert!(got.is_err(), "a foreign peer got {got:?} files");
    // The daemon's own destination still gets every file.
    let dest = Handoff::prepare().unwrap();
    assert_eq!(dest.fetch(&offer).unwrap().len(), 3);
}
