//! SET_DEVICE_STATE_FD and CHECK_DEVICE_STATE: the guest's session saved into, or
//! loaded from, the pipe or socket the VMM hands over (QEMU's live migration and
//! snapshots, cloud-hypervisor's snapshot, restore and migration).
//!
//! The VMM reads or writes the channel only once the message is answered, so the
//! transfer runs on a thread of its own, the state thread, and CHECK_DEVICE_STATE
//! waits for it: the answer there is the outcome. The state thread is started once,
//! confined for its role (it reads a state stream that may come from anywhere, and
//! reopens the session's files), before the daemon's own threads lose their
//! capabilities.
//!
//! A save is not destructive: a migration that fails resumes the source, which
//! serves on with everything it had. A load replaces whatever session the daemon
//! had; one refused leaves it as it was (`fs/session_load.rs`).

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use log::{error, info};
use vhost::vhost_user::message::{VhostTransferStateDirection, VhostTransferStatePhase};

use crate::fs::passthrough::state::HandedFiles;
use crate::fs::FsServer;
use crate::handoff::{Entry, Handoff};
use crate::region::{Half, Region};
use crate::state::format::{self, GuestView};
use crate::state::{LoadError, LoadOptions, SaveOptions};

/// What the state thread is told at start: the daemon's options.
#[derive(Clone, Default)]
pub struct StateConfig {
    pub view: GuestView,
    pub save: SaveOptions,
    pub load: LoadOptions,
    /// The sockets of the same-host hand-over of the guest's locks (None: the
    /// daemon could not make them; locks are then taken again).
    pub handoff: Option<Arc<Handoff>>,
}

/// What the keeper writes into the socket it hands over with SET_DEVICE_STATE_FD
/// SAVE for an upgrade's preview (`fs/passthrough/state/preview.rs`): the nodes are
/// written while the guest is served. A VMM hands over a pipe (or a socket it wrote
/// nothing into): a save as ever.
pub const PREVIEW_REQUEST: &[u8] = b"volfsd-preview\n";
/// And for the state after it, in the pause: the nodes of the last preview that still
/// live named as previewed ([`format::UpgradeState`]); without a preview, a state.
pub const AFTER_PREVIEW_REQUEST: &[u8] = b"volfsd-after-preview\n";

/// What a save was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SaveKind {
    State,
    Preview,
    AfterPreview,
}

/// The request the keeper wrote into `file` before handing it over, if it is a socket
/// holding one (read without waiting).
fn save_kind(file: &File) -> SaveKind {
    use std::os::fd::AsRawFd;
    // SAFETY: fstat into a zeroed struct, on an fd we own.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    let is_socket = unsafe { libc::fstat64(file.as_raw_fd(), &mut st) } == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFSOCK;
    if !is_socket {
        return SaveKind::State;
    }
    let mut buf = [0u8; 64];
    // SAFETY: recv into a buffer of its length, on an fd we own.
    let n = unsafe {
        libc::recv(
            file.as_raw_fd(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    match usize::try_from(n).ok().map(|n| &buf[..n]) {
        Some(r) if r == PREVIEW_REQUEST => SaveKind::Preview,
        Some(r) if r == AFTER_PREVIEW_REQUEST => SaveKind::AfterPreview,
        _ => SaveKind::State,
    }
}

enum Job {
    Save(File),
    Load(File),
    /// Serve on the session a killed serving process recorded in a journal half.
    Recover(&'static Region, Half),
}

/// Why a save or a load failed; CHECK_DEVICE_STATE answers it to the VMM as an
/// `io::Error`, and the state thread logs it.
#[derive(Debug)]
pub enum TransferError {
    /// Writing the saved state (`bytes` long) into the VMM's channel failed.
    Write { bytes: usize, source: io::Error },
    /// The state was not loaded (nothing of it is kept).
    Load(LoadError),
}

impl std::fmt::Display for TransferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransferError::Write { bytes, source } => {
                write!(f, "writing {bytes} bytes of state: {source}")
            }
            TransferError::Load(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for TransferError {}

impl From<LoadError> for TransferError {
    fn from(e: LoadError) -> Self {
        TransferError::Load(e)
    }
}

/// A job and where its outcome goes.
type Queued = (Job, Sender<Result<(), TransferError>>);

/// What the state needs from the device beside the file system: its unanswered
/// requests at a save, whether those of a loaded state are what its rings can take
/// (checked before the load changes anything; a refusal is a
/// [`LoadError::Invalid`]), and where they go once it is loaded.
pub struct DeviceSide {
    pub collect: Box<dyn Fn() -> Vec<format::ParkedRequest> + Send>,
    pub check: Box<CheckParked>,
    pub deliver: Box<dyn Fn(Vec<format::ParkedRequest>) -> Result<(), LoadError> + Send>,
}

/// Whether a loaded state's unanswered requests are what the rings can take.
pub type CheckParked = dyn Fn(&[format::ParkedRequest]) -> Result<(), LoadError> + Send;

/// The device's side of the transfer: hands jobs to the state thread, and waits for
/// their outcome.
#[derive(Default)]
pub struct StateTransfer {
    jobs: Mutex<Option<Sender<Queued>>>,
    outcome: Mutex<Option<Receiver<Result<(), TransferError>>>>,
    /// Set once with the state thread.
    handoff: OnceLock<Arc<Handoff>>,
}

impl StateTransfer {
    /// Starts the state thread, confined for its role.
    pub fn start_thread(
        &self,
        server: Arc<FsServer>,
        cfg: StateConfig,
        device: DeviceSide,
    ) -> io::Result<()> {
        let (tx, rx) = mpsc::channel::<Queued>();
        if let Some(h) = &cfg.handoff {
            let _ = self.handoff.set(h.clone());
        }
        crate::sandbox::threads::spawn_confined(
            "volfsd-state",
            crate::sandbox::ThreadRole::State,
            move || {
                for (job, done) in rx {
                    let result = match job {
                        Job::Save(file) => save(&server, &cfg, &device, file),
                        Job::Load(file) => load(&server, &cfg, &device, file),
                        Job::Recover(region, half) => recover(&server, &cfg, region, half),
                    };
                    if let Err(e) = &result {
                        // The VMM learns only that it failed: the why is here.
                        error!("device state: {e}");
                    }
                    let _ = done.send(result);
                }
            },
        )?;
        *self.jobs.lock().unwrap() = Some(tx);
        Ok(())
    }

    /// SET_DEVICE_STATE_FD: starts a save into `file` or a load from it, and answers
    /// at once (the VMM moves the bytes after the answer).
    pub fn begin(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<Option<File>> {
        if phase != VhostTransferStatePhase::STOPPED {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a device state is transferred only with the device stopped",
            ));
        }
        let jobs = self.jobs.lock().unwrap();
        let Some(jobs) = jobs.as_ref() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no state thread: this daemon does not transfer its state",
            ));
        };
        let job = match direction {
            VhostTransferStateDirection::SAVE => Job::Save(file),
            VhostTransferStateDirection::LOAD => Job::Load(file),
        };
        let (done_tx, done_rx) = mpsc::channel();
        jobs.send((job, done_tx))
            .map_err(|_| io::Error::other("the state thread is gone"))?;
        *self.outcome.lock().unwrap() = Some(done_rx);
        Ok(None)
    }

    /// A ring is served at this daemon again (a refused live migration, a snapshot
    /// the VM carries on from): what a save offered a destination on this host is
    /// withdrawn. Its copies of the lock files would otherwise hold the guest's locks
    /// after the guest lets go of them here. (Not at SET_FEATURES: QEMU's resume may
    /// look like the end of a migration's dirty logging there.)
    pub fn serving_again(&self) {
        if let Some(handoff) = self.handoff.get() {
            handoff.withdraw();
        }
    }

    /// Serves on the guest's session that a serving process killed under it recorded
    /// in journal `half`, on the state thread (confined for loading states); waits.
    pub fn recover(&self, region: &'static Region, half: Half) -> Result<(), TransferError> {
        let gone = || TransferError::Load(LoadError::Io("the state thread is gone".into()));
        let (done_tx, done_rx) = mpsc::channel();
        {
            let jobs = self.jobs.lock().unwrap();
            let jobs = jobs.as_ref().ok_or_else(gone)?;
            jobs.send((Job::Recover(region, half), done_tx))
                .map_err(|_| gone())?;
        }
        done_rx.recv().map_err(|_| gone())?
    }

    /// CHECK_DEVICE_STATE: the outcome of the last transfer, once it is over.
    pub fn check(&self) -> io::Result<()> {
        let Some(done) = self.outcome.lock().unwrap().take() else {
            return Err(io::Error::other(
                "CHECK_DEVICE_STATE with no transfer started",
            ));
        };
        match done.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(io::Error::other(e)),
            Err(_) => Err(io::Error::other("the state thread ended during a transfer")),
        }
    }
}

/// An upgrade's preview, written while the guest is served.
fn preview(server: &FsServer, cfg: &StateConfig, mut file: File) -> Result<(), TransferError> {
    let start = Instant::now();
    let preview = server.preview_session(cfg.view.clone(), &cfg.save);
    let bytes = format::encode_preview(&preview);
    let took = start.elapsed();
    file.write_all(&bytes)
        .map_err(|source| TransferError::Write {
            bytes: bytes.len(),
            source,
        })?;
    drop(file);
    info!(
        "upgrade preview {} taken: {} nodes, {} bytes; collected in {:.1} ms, written in {:.1} ms",
        preview.id,
        preview.state.nodes.len(),
        bytes.len(),
        took.as_secs_f64() * 1e3,
        (start.elapsed() - took).as_secs_f64() * 1e3
    );
    Ok(())
}

fn save(
    server: &FsServer,
    cfg: &StateConfig,
    device: &DeviceSide,
    mut file: File,
) -> Result<(), TransferError> {
    let kind = save_kind(&file);
    if kind == SaveKind::Preview {
        return preview(server, cfg, file);
    }
    let start = Instant::now();
    let after = match kind {
        SaveKind::AfterPreview => server.save_after_preview(cfg.view.clone(), &cfg.save),
        _ => None,
    };
    let (mut state, files, previewed) = match after {
        Some((up, files)) => (up.state, files, Some((up.preview, up.previewed))),
        None => {
            let (state, files) = server.save_session(cfg.view.clone(), &cfg.save);
            (state, files, None)
        }
    };
    state.parked = (device.collect)();
    if let Some(handoff) = &cfg.handoff {
        let mut offered = Vec::new();
        for ((node, owner), f) in &files.lock_files {
            if let Ok(dup) = f.try_clone() {
                offered.push((
                    Entry::LockFile {
                        node: *node,
                        owner: *owner,
                    },
                    dup.into(),
                ));
            }
        }
        for (id, h) in &files.flock_handles {
            if let Ok(dup) = h.file.try_clone() {
                offered.push((Entry::FlockHandle { handle: *id }, dup.into()));
            }
        }
        // Without an offer the destination takes the locks again (a gap in which
        // another may take them); the save itself goes on.
        state.handoff = handoff.offer(offered).unwrap_or_else(|e| {
            log::warn!("cannot offer the guest's locks to a destination on this host: {e}");
            None
        });
    }
    let as_previewed = previewed.as_ref().map_or(0, |(_, p)| p.len());
    let bytes = match previewed {
        Some((preview, previewed)) => {
            let up = format::UpgradeState {
                preview,
                previewed,
                state,
            };
            let bytes = format::encode_upgrade(&up);
            state = up.state;
            bytes
        }
        None => format::encode(&state),
    };
    let took = start.elapsed();
    file.write_all(&bytes)
        .map_err(|source| TransferError::Write {
            bytes: bytes.len(),
            source,
        })?;
    // Closing the channel is the end of the data for the VMM.
    drop(file);
    info!(
        "device state saved: {} nodes ({} as previewed), {} handles, {} locks, {} volumes, \
         {} unanswered requests, {} bytes; collected in {:.1} ms, written in {:.1} ms",
        state.nodes.len() + as_previewed,
        as_previewed,
        state.handles.len(),
        state.locks.len(),
        state.volumes.len(),
        state.parked.len(),
        bytes.len(),
        took.as_secs_f64() * 1e3,
        (start.elapsed() - took).as_secs_f64() * 1e3
    );
    Ok(())
}

fn load(
    server: &FsServer,
    cfg: &StateConfig,
    device: &DeviceSide,
    file: File,
) -> Result<(), TransferError> {
    let start = Instant::now();
    let bytes = read_bounded(file)?;
    let (mut state, preview) = match format::kind(&bytes) {
        format::Kind::Preview => {
            let preview = format::decode_preview(&bytes).map_err(LoadError::from)?;
            let (kept, not) = server.preload_session(&preview, &cfg.view)?;
            info!(
                "upgrade preview {} preloaded: {kept} nodes opened, {not} not ({} bytes in \
                 {:.1} ms)",
                preview.id,
                bytes.len(),
                start.elapsed().as_secs_f64() * 1e3
            );
            return Ok(());
        }
        format::Kind::Upgrade => {
            let up = format::decode_upgrade(&bytes).map_err(LoadError::from)?;
            (up.state, Some((up.preview, up.previewed)))
        }
        _ => (format::decode(&bytes).map_err(LoadError::from)?, None),
    };
    let read = start.elapsed();
    let handed = match (&state.handoff, &cfg.handoff) {
        (Some(offer), Some(handoff)) => match handoff.fetch(offer) {
            Ok(files) => handed_files(files),
            Err(why) => {
                log::info!("the source's open files are not handed over ({why}): its locks are taken again");
                HandedFiles::default()
            }
        },
        _ => HandedFiles::default(),
    };
    (device.check)(&state.parked)?;
    let report = match preview {
        Some((preview, previewed)) => {
            let up = format::UpgradeState {
                preview,
                previewed,
                state,
            };
            let report = server.load_upgrade(&up, &cfg.view, &cfg.load, handed)?;
            state = up.state;
            report
        }
        None => server.load_session(&state, &cfg.view, &cfg.load, handed)?,
    };
    if let Err(e) = (device.deliver)(state.parked.clone()) {
        // Checked above: only a device gone meanwhile gets here.
        server.start_over();
        return Err(e.into());
    }
    info!(
        "device state loaded ({}): {} nodes, {} handles, {} locks ({} waited for, {} handed \
         over); lost {} nodes and {} handles; {} bytes read in {:.1} ms, applied in {:.1} ms",
        state.written_by,
        report.nodes,
        report.handles,
        report.locks,
        report.pending_locks,
        report.handed_over_locks,
        report.lost_nodes,
        report.lost_handles,
        bytes.len(),
        read.as_secs_f64() * 1e3,
        (start.elapsed() - read).as_secs_f64() * 1e3
    );
    Ok(())
}

fn recover(
    server: &FsServer,
    cfg: &StateConfig,
    region: &Region,
    half: Half,
) -> Result<(), TransferError> {
    let start = Instant::now();
    let (report, dropped) = server.recover_session(region.half(half), &cfg.view)?;
    info!(
        "the guest's session taken over from the killed serving process's journal: {} \
         nodes, {} handles, {} locks; lost {} nodes and {} handles (ESTALE), {} records \
         named what is not here; in {:.1} ms",
        report.nodes,
        report.handles,
        report.locks,
        report.lost_nodes,
        report.lost_handles,
        dropped,
        start.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

fn handed_files(files: Vec<(Entry, std::os::fd::OwnedFd)>) -> HandedFiles {
    let mut handed = HandedFiles::default();
    for (entry, fd) in files {
        match entry {
            Entry::LockFile { node, owner } => {
                handed.lock_files.insert((node, owner), File::from(fd));
            }
            Entry::FlockHandle { handle } => {
                handed.flock_handles.insert(handle, File::from(fd));
            }
        }
    }
    handed
}

/// Reads the whole state, refusing more than a state may be long (the header says how
/// long the body is; nothing more is read than that and the header).
fn read_bounded(mut file: File) -> Result<Vec<u8>, LoadError> {
    let mut header = vec![0u8; format::HEADER_LEN];
    let mut got = 0;
    while got < header.len() {
        match file.read(&mut header[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(LoadError::Io(e.to_string())),
        }
    }
    header.truncate(got);
    let length = format::body_length_any(&header)?;
    let mut bytes = header;
    // Grows as bytes come, up to the length: a header that lies about it costs
    // nothing until the bytes are really there.
    let mut limited = (&mut file).take(length + 1);
    limited
        .read_to_end(&mut bytes)
        .map_err(|e| LoadError::Io(e.to_string()))?;
    Ok(bytes)
}
