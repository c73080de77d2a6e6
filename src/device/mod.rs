//! The vhost-user virtio-fs device: features, queues and the per-queue workers.
//!
//! Queue 0 is the hiprio queue (FORGET, INTERRUPT); queues 1..=N are request queues.
//! Each request queue has its own worker thread (the hiprio queue shares the first
//! one), so a multi-queue guest is served in parallel.
//!
//! The device knows the transport only: rings (`ring.rs`), the drain (`queue.rs`),
//! a request's local copy (`request.rs`), requests answered later (`later/`), the
//! dirty-page log and the device state's thread. What a request is, its volume,
//! cost and reply are the file system's, asked through `fs/request.rs`.

pub mod dirty_log;
pub mod guest_buffers;
pub mod guest_io;
pub mod inflight;
pub mod later;
pub mod memory;
pub mod poll;
pub mod queue;
pub mod queues;
pub mod request;
pub mod ring;
pub mod split_ring;
pub mod state_transfer;

use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use log::{debug, info, warn};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringEpollHandler, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vm_memory::GuestAddressSpace;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventNotifier};
use vmm_sys_util::eventfd::EventFd;

use crate::fs::{FsServer, Stack};
use crate::region::{Half, Region};
use dirty_log::LogBitmap;
use later::Parked;
pub use memory::{GuestMem, GuestMmap, Vring};
use queue::QueueRef;
use queues::{global_queue_index, queue_masks, DeviceQueue, Queues};
pub use ring::QueueCounters;
use ring::QueueStart;
pub use ring::MAX_QUEUE_SIZE;
use state_transfer::{StateConfig, StateTransfer};

/// How often a worker looks whether the rings a loaded state's unanswered requests
/// belong to run yet.
const INCOMING_POLL: Duration = Duration::from_millis(20);

/// The most request queues: vhost-user-backend gives each worker a 64-bit queue
/// mask, and the hiprio queue takes one bit.
pub const MAX_REQUEST_QUEUES: usize = 63;

/// Live counters of the device, readable from any thread.
#[derive(Default)]
pub struct DeviceStats {
    /// Per queue (index = queue index): requests served and being served.
    pub queues: Vec<Arc<QueueCounters>>,
    /// Whether a frontend is connected (set on memory table, cleared on exit).
    pub connected: AtomicBool,
    /// Queues the frontend has started (kicked at least once).
    pub active_queues: AtomicUsize,
}

pub struct FsBackend {
    server: Arc<FsServer>,
    mem: RwLock<Option<GuestMem>>,
    event_idx: AtomicBool,
    num_request_queues: usize,
    stats: Arc<DeviceStats>,
    /// Each queue, by index (`queues.rs`); shared with the state thread (a saved
    /// state's throttled requests) and the volumes (their limits changing wakes the
    /// workers).
    queues: Arc<Queues>,
    /// Lock waits in progress, and requests a loaded state handed over unanswered.
    parked: Arc<Parked>,
    /// Device starts (SET_FEATURES) so far, and the start in which a new driver last
    /// reset the session: one reset per start, whichever queue sees it first.
    starts: AtomicU64,
    reset_in_start: AtomicU64,
    /// SET_DEVICE_STATE_FD / CHECK_DEVICE_STATE.
    state: StateTransfer,
    /// One exit eventfd per worker thread index, for the daemon's whole life (see
    /// `exit_event`).
    exit_events: Vec<EventFd>,
    /// The features of the last SET_FEATURES ([`NO_FEATURES`] before the first).
    features: AtomicU64,
    /// The session region under a keeper: the requests in flight, the keeper's
    /// counters, and the journal a takeover loads (src/daemon/recording.rs).
    region: Option<&'static Region>,
}

/// No SET_FEATURES yet: never a real set, since vhost-user-backend refuses features
/// the backend does not offer, and it offers fewer than all 64.
const NO_FEATURES: u64 = u64::MAX;

impl FsBackend {
    /// Fails only when the wake timers cannot be made (out of fds).
    /// `poll`: each queue's polling window after its ring ran dry (`poll.rs`; zero:
    /// none). `region`: the session region under a keeper.
    pub fn new(
        stack: &Stack,
        num_request_queues: usize,
        poll: Duration,
        region: Option<&'static Region>,
    ) -> io::Result<Self> {
        let queues = Arc::new(Queues::new(num_request_queues, poll, region)?);
        let stats = DeviceStats {
            queues: queues.iter().map(|q| q.counters.clone()).collect(),
            ..Default::default()
        };
        let on_change = queues.clone();
        stack
            .volumes
            .on_limits_changed(Box::new(move || on_change.wake_all(Duration::ZERO)));
        Ok(FsBackend {
            server: Arc::new(FsServer::new(stack)),
            mem: RwLock::new(None),
            event_idx: AtomicBool::new(false),
            num_request_queues,
            stats: Arc::new(stats),
            queues,
            parked: Arc::default(),
            starts: AtomicU64::new(0),
            reset_in_start: AtomicU64::new(0),
            state: StateTransfer::default(),
            exit_events: (0..num_request_queues)
                .map(|_| EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC))
                .collect::<io::Result<_>>()?,
            features: AtomicU64::new(NO_FEATURES),
            region,
        })
    }

    /// This process takes over from one killed under a guest's session: the
    /// session it recorded in journal `half` is loaded (on the state thread), and
    /// each queue's requests left unanswered are answered once its ring runs here.
    pub fn recover(&self, half: Half) -> Result<(), state_transfer::TransferError> {
        let Some(region) = self.region else {
            return Err(state_transfer::TransferError::Load(
                crate::state::LoadError::Io("no session region: no keeper".into()),
            ));
        };
        let loaded = self.state.recover(region, half);
        for q in self.queues.iter() {
            q.set_recovering(q.inflight.is_kept());
        }
        loaded
    }

    /// The requests the dead process left unanswered on queue `index`, whose ring
    /// runs: the ring continues after them, and each is run again or failed.
    fn recover_queue(
        &self,
        index: usize,
        queue: &QueueRef,
        state: &mut memory::Locked,
        mem: &GuestMem,
    ) {
        use virtio_queue::QueueT;
        use vm_memory::{Bytes, GuestAddress};
        let guest = mem.memory();
        let q = state.get_queue();
        let (table, size, used_ring) = (q.desc_table(), q.size(), q.used_ring());
        let Ok(used_idx) = q.used_idx(&*guest, Ordering::Acquire) else {
            warn!("queue {index}: its used ring cannot be read: nothing recovered");
            return;
        };
        // A used element is 8 bytes, after the ring's flags and index.
        let used_id = |i: u16| {
            let at = used_ring.checked_add(4 + 8 * u64::from(i % size.max(1)))?;
            guest.read_obj::<u32>(GuestAddress(at)).ok()
        };
        let left = self.queues[index]
            .inflight
            .unanswered(table, size, used_idx.0, used_id);
        state.get_queue_mut().set_next_avail(left.next_avail);
        if !left.heads.is_empty() {
            info!(
                "queue {index}: {} requests the killed serving process had taken are answered here",
                left.heads.len()
            );
            match later::answer_recovered(
                &self.server,
                mem,
                &queue.ring,
                &queue.later,
                state,
                &left.heads,
            ) {
                Ok(answered) => {
                    if let Some(region) = self.region {
                        let c = &region.header().counters;
                        c.requests_rerun
                            .fetch_add(answered.rerun, Ordering::Relaxed);
                        c.requests_failed
                            .fetch_add(answered.failed, Ordering::Relaxed);
                    }
                }
                Err(e) => warn!("queue {index}: {e}"),
            }
        }
        // The killed process may have returned completions and died before their
        // interrupt: a guest whose every task waits on one of them never kicks again.
        // One interrupt too many costs the guest a look at its used ring.
        if let Err(e) = state.signal_used_queue() {
            warn!("queue {index}: the interrupt after the takeover: {e}");
        }
    }

    /// The event id of the workers' wake timers: above the queues and the exit event,
    /// as vhost-user-backend requires of extra listeners.
    fn wake_event(&self) -> u16 {
        (self.num_request_queues + 2) as u16
    }

    /// Adds each worker's wake timer to its event loop.
    pub fn register_wake_timers(
        &self,
        handlers: &[Arc<VringEpollHandler<Arc<FsBackend>>>],
    ) -> io::Result<()> {
        // Worker t serves request queue t + 1 (and worker 0 the hiprio queue too).
        for (t, handler) in handlers.iter().enumerate() {
            if let Some(timer) = self.queues.get(t + 1).and_then(DeviceQueue::timer) {
                handler.register_listener(
                    timer.as_raw_fd(),
                    EventSet::IN,
                    u64::from(self.wake_event()),
                )?;
            }
        }
        Ok(())
    }

    /// Drops every throttled request unanswered, and every lock wait's answer still
    /// to come: the session's rings are gone.
    fn drop_waiting(&self) {
        for q in self.queues.iter() {
            q.drop_waiting();
        }
        self.parked.forget_incoming();
    }

    /// Worker `thread`'s wake timer fired: serve the waiting requests of its request
    /// queue whose turn came.
    fn wake(&self, thread: usize, vrings: &[Vring]) {
        let index = thread + 1;
        // Thread 0's vrings are the hiprio queue and request queue 1.
        let local = if thread == 0 { 1 } else { 0 };
        let timer = self.queues.get(index).and_then(DeviceQueue::timer);
        let (Some(timer), Some(vring)) = (timer, vrings.get(local)) else {
            return;
        };
        timer.consume();
        let queue = self.queue_ref(index, vring);
        // Under the vring's lock: the frontend cannot stop the ring between the
        // check that it runs and the answers.
        let mut state = vring.get_mut();
        if self.parked.has_incoming() && !self.answer_incoming(index, &queue, &mut state) {
            // A loaded state's requests wait for their rings: look again soon.
            timer.arm(INCOMING_POLL);
        }
        let woken = later::release_waiting(
            &self.server,
            &queue.ring,
            &queue.later,
            &mut state,
            later::Wake::Timer,
        );
        if let Err(e) = woken {
            warn!("queue {index}: {e}");
        }
    }

    /// Answers the requests a loaded device state handed over for queue `index`, once
    /// the frontend runs the ring (the destination of a migration sets it up after
    /// the load). Returns false while the ring does not run yet.
    fn answer_incoming(&self, index: usize, queue: &QueueRef, state: &mut memory::Locked) -> bool {
        use virtio_queue::QueueT;
        if !state.get_queue().ready() || !state.is_enabled() {
            return false;
        }
        let Some(mem) = self.mem.read().unwrap().clone() else {
            return false;
        };
        let requests = self.parked.take_incoming(index);
        if !requests.is_empty() {
            debug!(
                "queue {index}: answering {} requests of the loaded state",
                requests.len()
            );
            let answered = later::answer_parked(
                &self.server,
                &mem,
                &queue.ring,
                &queue.later,
                state,
                requests,
            );
            if let Err(e) = answered {
                warn!("queue {index}: {e}");
            }
        }
        true
    }

    /// A loaded state handed over unanswered requests: each worker looks for its
    /// ring on its timer until the frontend runs it.
    fn poll_for_incoming(&self) {
        self.queues.wake_all(INCOMING_POLL);
    }

    fn queue_ref<'a>(&'a self, index: usize, vring: &'a Vring) -> QueueRef<'a> {
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        self.queues[index].queue_ref(vring, event_idx, &self.parked)
    }

    pub fn stats(&self) -> Arc<DeviceStats> {
        self.stats.clone()
    }

    /// The frontend went away and another may come (`--keep-serving`): what this
    /// connection set up goes, and the guest's session ends as on a device reset.
    pub fn connection_ended(&self) {
        *self.mem.write().unwrap() = None;
        self.stats.connected.store(false, Ordering::Relaxed);
        self.event_idx.store(false, Ordering::Relaxed);
        for q in self.queues.iter() {
            q.connection_ended();
        }
        self.stats.active_queues.store(0, Ordering::Relaxed);
        self.drop_waiting();
        self.server.start_over();
    }

    /// Starts the thread that saves and loads the device state, confined for its
    /// role.
    pub fn start_state_thread(self: &Arc<Self>, cfg: StateConfig) -> io::Result<()> {
        let collect = {
            let (parked, queues) = (self.parked.clone(), self.queues.clone());
            Box::new(move || parked.collect(queues.rooms()))
        };
        let deliver = {
            let me = Arc::downgrade(self);
            Box::new(move |requests: Vec<crate::state::format::ParkedRequest>| {
                // What parked.rs refuses makes the state invalid.
                let invalid = |why: String| crate::state::LoadError::Invalid(why);
                let me = me
                    .upgrade()
                    .ok_or_else(|| invalid("the device is gone".into()))?;
                let any = !requests.is_empty();
                me.parked
                    .deliver(requests, me.num_request_queues + 1)
                    .map_err(|e| invalid(e.to_string()))?;
                if any {
                    me.poll_for_incoming();
                }
                Ok(())
            })
        };
        let check = {
            let queues = self.num_request_queues + 1;
            Box::new(move |requests: &[crate::state::format::ParkedRequest]| {
                crate::device::later::Parked::check(requests, queues)
                    .map_err(|e| crate::state::LoadError::Invalid(e.to_string()))
            })
        };
        self.state.start_thread(
            self.server.clone(),
            cfg,
            state_transfer::DeviceSide {
                collect,
                check,
                deliver,
            },
        )
    }
}

impl VhostUserBackend for FsBackend {
    type Bitmap = LogBitmap;
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        self.num_request_queues + 1
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_RING_F_INDIRECT_DESC
            | 1 << VIRTIO_RING_F_EVENT_IDX
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            // Dirty-page logging during a live migration (see `GuestMmap`). Without
            // it QEMU refuses to migrate the VM.
            | VhostUserVirtioFeatures::LOG_ALL.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::RESET_DEVICE
            | VhostUserProtocolFeatures::DEVICE_STATE
            // The dirty-page log comes as a shared memory fd (SET_LOG_BASE).
            // INFLIGHT_SHMFD is not offered here: vhost-user-backend 0.22 answers
            // its messages with an error that ends the connection. Under
            // --upgradable the keeper offers it and answers them itself
            // (src/keeper/handback.rs): the region it hands out is the journal.
            | VhostUserProtocolFeatures::LOG_SHMFD
    }

    fn acked_features(&self, features: u64) {
        let log_all = VhostUserVirtioFeatures::LOG_ALL.bits();
        let before = self.features.swap(features, Ordering::AcqRel);
        if features & log_all == 0 {
            if let Some(mem) = self.mem.read().unwrap().as_ref() {
                dirty_log::stop_logging(&mem.memory());
            }
        }
        // A live migration turns LOG_ALL on (and off when it ends or fails) with a
        // SET_FEATURES of its own that changes nothing else: that is no device start.
        // Counted as one, it let a reboot's second queue end the session the first
        // queue had just begun (one reset per start).
        if before != NO_FEATURES && before ^ features == log_all {
            if features & log_all != 0 {
                info!("dirty-page logging on: a live migration started");
            } else {
                info!("dirty-page logging off: the live migration ended");
            }
            return;
        }
        // SET_FEATURES opens every other device start, a resume after a pause included.
        self.starts.fetch_add(1, Ordering::AcqRel);
    }

    fn reset_device(&self) {
        debug!("device reset by the frontend: the guest session ends");
        self.drop_waiting();
        self.server.start_over();
        for q in self.queues.iter() {
            q.inflight.clear();
        }
    }

    fn set_device_state_fd(
        &self,
        direction: vhost::vhost_user::message::VhostTransferStateDirection,
        phase: vhost::vhost_user::message::VhostTransferStatePhase,
        file: std::fs::File,
    ) -> io::Result<Option<std::fs::File>> {
        debug!("SET_DEVICE_STATE_FD {direction:?} {phase:?}");
        self.state.begin(direction, phase, file)
    }

    fn check_device_state(&self) -> io::Result<()> {
        self.state.check()
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn update_memory(&self, mem: GuestMem) -> io::Result<()> {
        *self.mem.write().unwrap() = Some(mem);
        self.stats.connected.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Thread 0 serves the hiprio queue and request queue 1; thread i serves request
    /// queue i+1.
    fn queues_per_thread(&self) -> Vec<u64> {
        queue_masks(self.num_request_queues)
    }

    /// vhost-user-backend registers the consumer's fd in the worker's epoll with
    /// `into_raw_fd` and never closes it: a new pair per frontend (`--keep-serving`)
    /// leaked one eventfd per worker each time (found by the keep-serving test). So
    /// each worker index has one eventfd for the daemon's life: its own fd goes to
    /// the crate as the consumer, a dup as the notifier (which the crate closes), and
    /// an exit event left from the last frontend is drained first.
    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let efd = self.exit_events.get(thread_index)?;
        while efd.read().is_ok() {}
        let fd = efd.as_raw_fd();
        // SAFETY: dup of an fd we own; the result is checked.
        let dup = unsafe { libc::dup(fd) };
        if dup < 0 {
            return None;
        }
        // SAFETY: `fd` stays open for the daemon's life (we own it in
        // `exit_events`) and the crate only ever takes it with `into_raw_fd`, never
        // closing it; `dup` is a new fd that the notifier owns and closes.
        unsafe {
            Some((
                EventConsumer::from_raw_fd(fd),
                EventNotifier::from_raw_fd(dup),
            ))
        }
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        // Each worker thread counts its requests in a shard of its own.
        crate::metrics::serve_as_worker(thread_id);
        if device_event == self.wake_event() {
            self.wake(thread_id, vrings);
            return Ok(());
        }
        // vhost-user-backend numbers events and `vrings` per worker thread; `index`
        // is the queue's index on the device (0 = hiprio).
        let Some(index) = global_queue_index(self.num_request_queues, thread_id, device_event)
        else {
            warn!("thread {thread_id}: event {device_event} for no queue");
            return Ok(());
        };
        if evset != EventSet::IN {
            warn!("queue {index}: unexpected event set {evset:?}");
            return Ok(());
        }
        let Some(vring) = vrings.get(device_event as usize) else {
            warn!("thread {thread_id}: no vring for event {device_event}");
            return Ok(());
        };
        if self.queues[index].start() {
            self.stats.active_queues.fetch_add(1, Ordering::Relaxed);
            debug!("queue {index} started");
        }
        let Some(mem) = self.mem.read().unwrap().clone() else {
            warn!("queue {index} kicked before the memory table was set");
            return Ok(());
        };
        // The vring's lock from the first look to the last completion: the frontend
        // can neither stop the ring nor set it up anew while its requests are
        // served (GET_VRING_BASE waits, and then counts them answered).
        let mut state = vring.get_mut();
        // A queue set up anew from index 0 is a new driver (a reboot): the old
        // session's node ids, handles and locks go, once per device start. A resume
        // after a pause keeps its ring position, so it keeps its session.
        if self.queues[index].health.check_restart(&state) == QueueStart::NewDriver {
            // Its throttled requests belong to the old ring, and so do the ones a
            // killed process left.
            self.queues[index].new_driver();
            let start = self.starts.load(Ordering::Acquire);
            if self.reset_in_start.swap(start, Ordering::AcqRel) != start {
                debug!("queue {index}: a new driver started the device");
                self.server.start_over();
            }
        }
        if virtio_queue::QueueT::ready(state.get_queue()) && state.is_enabled() {
            // Serving here again after a save (a refused live migration, a snapshot
            // the VM goes on from): a same-host offer of the locks is withdrawn.
            self.state.serving_again();
        }
        // Errors here are the guest's or the frontend's; they never stop the worker.
        let queue = self.queue_ref(index, vring);
        let runs = virtio_queue::QueueT::ready(state.get_queue()) && state.is_enabled();
        if runs && self.queues[index].take_recovering() {
            self.recover_queue(index, &queue, &mut state, &mem);
        }
        if self.parked.has_incoming() {
            // A loaded state's requests go first: the guest sent them first.
            self.answer_incoming(index, &queue, &mut state);
        }
        if let Err(e) = queue::process(&self.server, &mem, &queue, &mut state) {
            warn!("queue {index}: {e}");
        }
        Ok(())
    }
}
