//! Dirty-page logging for live migration, through the vhost-user socket: the test
//! plays a VMM that migrates (VHOST_USER_PROTOCOL_F_LOG_SHMFD, SET_LOG_BASE with a
//! memfd log, SET_FEATURES with VHOST_F_LOG_ALL) and checks that the daemon sets the
//! bit of exactly the pages it wrote: a READ's reply header and data, a GETATTR's
//! reply, and the used ring. A page whose bit stayed clear is not copied again by
//! the VMM, so a missing bit is a reply lost on the destination.

use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{AttrOut, GetattrIn, Opcode, OutHeader, ReadIn};
use vm_memory::{ByteValued, GuestAddress};
use volfsd_harness::fixtures::{Daemon, RDONLY, ROOT};
use volfsd_harness::frontend::dirty_log::{pages_of, DirtyLog, LOG_PAGE};
use volfsd_harness::frontend::fuse::{ChainPart, FuseOps, FuseQueue, InitParams, RawChain};
use volfsd_harness::frontend::{FuseClient, GuestBuffer, Request, Segment};

/// 3 pages and a bit: the READ's data crosses page boundaries.
const FILE_LEN: u64 = 3 * LOG_PAGE + 100;
const OUT_HEADER: u64 = std::mem::size_of::<OutHeader>() as u64;

fn content() -> Vec<u8> {
    (0..FILE_LEN).map(|i| (i % 251) as u8).collect()
}

/// A daemon with a host file `f`, and a client that negotiated LOG_SHMFD, did INIT,
/// and opened `f`: returns (daemon, client, node, fh).
fn setup(test: &str) -> (Daemon, FuseClient, u64, u64) {
    let d = Daemon::start(test, &[]);
    std::fs::write(d.host("f"), content()).unwrap();
    let mut cfg = d.config();
    cfg.dirty_log = true;
    let mut c = FuseClient::connect(&cfg).expect("connect");
    c.init_session(&InitParams::default()).expect("INIT");
    let node = c.lookup(ROOT, "f").expect("lookup").nodeid;
    let fh = c.open(node, RDONLY).expect("open").fh;
    (d, c, node, fh)
}

/// A reply buffer at a known guest address: `len` bytes from `offset` into pages of
/// its own (the allocation is page-aligned by hand and one page larger).
struct Placed {
    buf: GuestBuffer,
    addr: u64,
    len: u64,
}

impl Placed {
    fn new(c: &mut FuseClient, offset: u64, len: u64) -> Placed {
        let pages = (offset + len).div_ceil(LOG_PAGE) + 1;
        let buf = c.device().memory().alloc(pages * LOG_PAGE).unwrap();
        // Poisoned, so a reply that was not written shows.
        buf.fill(0xa5).unwrap();
        let addr = buf.addr().0.div_ceil(LOG_PAGE) * LOG_PAGE + offset;
        Placed { buf, addr, len }
    }

    fn segment(&self) -> ChainPart {
        ChainPart::Raw(Segment::new(GuestAddress(self.addr), self.len as u32))
    }

    fn read(&self, len: u64) -> Vec<u8> {
        self.buf
            .read_at(self.addr - self.buf.addr().0, len)
            .unwrap()
    }

    /// Every page of the allocation, written or not.
    fn all_pages(&self) -> impl Iterator<Item = u64> {
        pages_of(self.buf.addr().0, self.buf.len())
    }
}

/// A request whose reply goes to `parts` (placed buffers) instead of buffers the
/// queue allocates.
fn placed_chain(request: &Request, unique: u64, parts: &[&Placed]) -> RawChain {
    let mut chain = request.to_chain(unique);
    chain.writable = parts.iter().map(|p| p.segment()).collect();
    chain
}

fn out_header(p: &Placed) -> OutHeader {
    *OutHeader::from_slice(&p.read(OUT_HEADER)).unwrap()
}

/// The used-ring pages a completion at used position `pos` touched: its element and
/// the used index.
fn used_ring_pages(q: &mut FuseQueue, pos: u16) -> Vec<u64> {
    let ring = q.ring_mut();
    let used = ring.used_ring_addr().0;
    let slot = u64::from(pos % ring.size());
    let mut pages: Vec<u64> = pages_of(used + 2, 2).collect();
    pages.extend(pages_of(used + 4 + 8 * slot, 8));
    pages
}

/// A READ of the whole file and a GETATTR, each replying into placed buffers, on
/// request queue 0. Returns the pages the daemon must have written.
fn read_and_getattr(c: &mut FuseClient, node: u64, fh: u64) -> Vec<u64> {
    let read_header = Placed::new(c, 0x100, OUT_HEADER);
    // The data starts half-way into a page and its buffer is longer than the file:
    // the short read writes FILE_LEN bytes, the rest of the buffer stays untouched.
    let data = Placed::new(c, 0x800, FILE_LEN + 2 * LOG_PAGE);
    let attr_header = Placed::new(c, 0xff8, OUT_HEADER);
    let attr = Placed::new(c, 0, std::mem::size_of::<AttrOut>() as u64);
    let read = Request::new(Opcode::Read, node).arg(&ReadIn {
        fh,
        offset: 0,
        size: data.len as u32,
        ..Default::default()
    });
    let getattr = Request::new(Opcode::Getattr, node).arg(&GetattrIn::default());

    let q = c.request_queue(0).unwrap();
    let first_used = q.ring_mut().used_idx().unwrap();
    let t1 = q
        .submit_chain(&placed_chain(&read, 1001, &[&read_header, &data]))
        .unwrap();
    let t2 = q
        .submit_chain(&placed_chain(&getattr, 1003, &[&attr_header, &attr]))
        .unwrap();
    q.kick().unwrap();
    let done1 = q.wait_for(t1, Duration::from_secs(10)).expect("READ");
    let done2 = q.wait_for(t2, Duration::from_secs(10)).expect("GETATTR");

    // Both answered correctly: the bits below are for replies that are right.
    let h = out_header(&read_header);
    assert_eq!((h.unique, h.error), (1001, 0), "{h:?}");
    assert_eq!(u64::from(done1.used_len), OUT_HEADER + FILE_LEN);
    assert_eq!(data.read(FILE_LEN), content());
    assert_eq!(
        data.buf
            .read_at(data.addr - data.buf.addr().0 + FILE_LEN, 8)
            .unwrap(),
        [0xa5; 8],
        "nothing past the short read"
    );
    let h = out_header(&attr_header);
    assert_eq!((h.unique, h.error), (1003, 0), "{h:?}");
    assert_eq!(u64::from(done2.used_len), OUT_HEADER + attr.len);
    let out = *AttrOut::from_slice(&attr.read(attr.len)).unwrap();
    assert_eq!(out.attr.size, FILE_LEN);

    let mut written: Vec<u64> = pages_of(read_header.addr, OUT_HEADER)
        .chain(pages_of(data.addr, FILE_LEN))
        .chain(pages_of(attr_header.addr, OUT_HEADER))
        .chain(pages_of(attr.addr, attr.len))
        .collect();
    written.extend(used_ring_pages(q, first_used));
    written.extend(used_ring_pages(q, first_used.wrapping_add(1)));
    written.sort_unstable();
    written.dedup();
    // The test means what it says only if the buffers have pages nobody writes.
    let untouched = data.all_pages().filter(|p| !written.contains(p)).count();
    assert!(
        untouched >= 2,
        "{untouched} untouched pages in the data buffer"
    );
    written
}

#[test]
fn every_page_the_daemon_writes_is_logged_and_no_other() {
    let (_d, mut c, node, fh) = setup("dirty-log");
    let offered = c.device().features();
    assert_ne!(offered.offered_features & (1 << 26), 0, "LOG_ALL offered");
    assert_ne!(
        offered.acked_protocol_features
            & vhost::vhost_user::VhostUserProtocolFeatures::LOG_SHMFD.bits(),
        0,
        "LOG_SHMFD negotiated"
    );
    // As QEMU starts a migration: the log first, then LOG_ALL.
    let log = DirtyLog::new(c.device().memory().size()).unwrap();
    c.device().set_log_base(&log).expect("SET_LOG_BASE");
    c.device()
        .set_log_all(true)
        .expect("SET_FEATURES with LOG_ALL");
    assert_eq!(
        log.dirty_pages().unwrap(),
        [] as [u64; 0],
        "nothing written yet"
    );

    let written = read_and_getattr(&mut c, node, fh);
    // Exactly these: every page written is logged (a missing one is a reply lost
    // in a migration), and nothing else is (the guest's own pages, the request
    // buffers, the untouched rest of the data buffer are clear).
    assert_eq!(log.dirty_pages().unwrap(), written);

    // A VMM's next round: it clears the log and copies the pages; the next
    // requests are logged again.
    log.clear().unwrap();
    let written = read_and_getattr(&mut c, node, fh);
    assert_eq!(log.dirty_pages().unwrap(), written);
}

/// LOG_ALL with no log given is served as usual, a log given later holds only the
/// writes made after it came, and turning LOG_ALL off stops the logging.
#[test]
fn nothing_is_logged_without_a_log_or_once_log_all_is_off() {
    let (_d, mut c, node, fh) = setup("dirty-log-none");
    c.device()
        .set_log_all(true)
        .expect("SET_FEATURES with LOG_ALL");
    // Served correctly (read_and_getattr checks the replies), and the daemon lives.
    read_and_getattr(&mut c, node, fh);
    let log = DirtyLog::new(c.device().memory().size()).unwrap();
    c.device().set_log_base(&log).expect("SET_LOG_BASE");
    assert_eq!(
        log.dirty_pages().unwrap(),
        [] as [u64; 0],
        "writes made before the log came are not in it"
    );
    let written = read_and_getattr(&mut c, node, fh);
    assert_eq!(log.dirty_pages().unwrap(), written);
    // The migration is cancelled: LOG_ALL off (no device start). Nothing is logged
    // any more (the frontend may have let the log go), and the session carries on.
    c.device()
        .set_log_all(false)
        .expect("SET_FEATURES without LOG_ALL");
    log.clear().unwrap();
    read_and_getattr(&mut c, node, fh);
    assert_eq!(
        log.dirty_pages().unwrap(),
        [] as [u64; 0],
        "logged after LOG_ALL was turned off"
    );
    // A migration tried again logs again, in the log it brings.
    let again = DirtyLog::new(c.device().memory().size()).unwrap();
    c.device().set_log_base(&again).unwrap();
    c.device().set_log_all(true).unwrap();
    let written = read_and_getattr(&mut c, node, fh);
    assert_eq!(again.dirty_pages().unwrap(), written);
    assert_eq!(log.dirty_pages().unwrap(), [] as [u64; 0]);
}

/// A migration that starts while a rebooted guest brings up its queues: the
/// SET_FEATURES that turns LOG_ALL on is not a device start, so the second queue's
/// new driver does not end the session the first queue's INIT began.
#[test]
fn turning_the_log_on_is_not_a_device_start() {
    let d = Daemon::start("dirty-log-start", &[]);
    let mut cfg = d.config();
    cfg.dirty_log = true;
    cfg.request_queues = 2;
    let mut c = d.client_with(&cfg);
    // The old driver used both queues (a queue never served has no driver to
    // replace).
    c.use_request_queue(1).unwrap();
    c.getattr(ROOT).unwrap();
    // The guest reboots: its new driver sets both request queues up anew, and
    // begins its session on the first.
    c.restart_request_queue(0, 256).unwrap();
    c.restart_request_queue(1, 256).unwrap();
    c.use_request_queue(0).unwrap();
    c.init_session(&InitParams::default())
        .expect("INIT of the new driver");
    // The migration starts.
    let log = DirtyLog::new(c.device().memory().size()).unwrap();
    c.device().set_log_base(&log).unwrap();
    c.device().set_log_all(true).unwrap();
    // The second queue's first request: the new session serves it.
    c.use_request_queue(1).unwrap();
    c.getattr(ROOT)
        .expect("the session of the INIT on the first queue");
    assert!(
        !log.dirty_pages().unwrap().is_empty(),
        "the reply was logged"
    );
}
