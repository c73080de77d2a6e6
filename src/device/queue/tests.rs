//! The queue's tests: ring rules, draining, completions, late answers.
use super::*;
use fuse_backend_rs::abi::fuse_abi::WriteIn;
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{ByteValued, GuestAddress, GuestMemoryAtomic};

const NEXT: u16 = 1;
const WRITE: u16 = 2;

fn memory() -> GuestMmap {
    GuestMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap()
}

fn header(opcode: Opcode, len: usize) -> Vec<u8> {
    InHeader {
        len: len as u32,
        opcode: opcode as u32,
        unique: 7,
        nodeid: 1,
        ..Default::default()
    }
    .as_slice()
    .to_vec()
}

fn desc(addr: u64, len: usize, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len as u32, flags, next))
}

#[test]
fn a_request_is_copied_whole_in_one_walk_and_a_write_only_to_its_args() {
    let mem = memory();
    let q = MockSplitQueue::new(&mem, 16);
    // A GETXATTR split over two readable descriptors, then a reply buffer.
    let mut req = header(Opcode::Getxattr, 40 + 8 + 6);
    req.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
    req.extend_from_slice(b"user.a");
    mem.write_slice(&req[..30], GuestAddress(0x10_0000))
        .unwrap();
    mem.write_slice(&req[30..], GuestAddress(0x20_0000))
        .unwrap();
    let chain = q
        .build_desc_chain(&[
            desc(0x10_0000, 30, 0, 0),
            desc(0x20_0000, req.len() - 30, 0, 0),
            desc(0x30_0000, 4096, WRITE, 0),
        ])
        .unwrap();
    let mut buf = Vec::new();
    assert!(copy_request(&chain, &mut buf).is_ok());
    assert_eq!(buf, req);
    // Guest memory rewritten after the copy changes nothing the server reads.
    mem.write_slice(&[0xff; 30], GuestAddress(0x10_0000))
        .unwrap();
    assert_eq!(parse_header(&buf).unwrap().opcode, Opcode::Getxattr as u32);

    // A WRITE keeps only its header and WriteIn locally; the data stays behind.
    let mut w = header(Opcode::Write, 80 + 4096);
    w.extend_from_slice(
        WriteIn {
            size: 4096,
            ..Default::default()
        }
        .as_slice(),
    );
    mem.write_slice(&w, GuestAddress(0x10_0000)).unwrap();
    let q = MockSplitQueue::new(&mem, 16);
    let chain = q
        .build_desc_chain(&[
            desc(0x10_0000, 80, 0, 0),
            desc(0x20_0000, 4096, 0, 0),
            desc(0x30_0000, 64, WRITE, 0),
        ])
        .unwrap();
    assert!(copy_request(&chain, &mut buf).is_ok());
    assert_eq!(buf.len(), WRITE_PREFIX);
    assert_eq!(buf, w);
}

/// A 256-entry vring with its descriptors at 0, avail ring at 4 KiB, used at 8 KiB.
fn vring() -> Vring {
    let vring = Vring::new(GuestMemoryAtomic::new(memory()), 256).unwrap();
    vring.set_queue_size(256);
    vring.set_queue_info(0, 0x1000, 0x2000).unwrap();
    vring
}

#[test]
fn overlapping_rings_are_broken() {
    // Descriptors at 0 (4 KiB), avail ring after them, used ring apart: fine.
    let vring = vring();
    assert!(check_layout(&vring.get_ref()).is_ok());
    // The used ring laid over the avail ring: broken.
    vring.set_queue_info(0, 0x1000, 0x1000).unwrap();
    assert!(check_layout(&vring.get_ref()).is_err());
    vring.set_queue_info(0, 0x800, 0x3000).unwrap();
    assert!(
        check_layout(&vring.get_ref()).is_err(),
        "avail ring inside the table"
    );
}

#[test]
fn a_queue_stopped_after_serving_stays_stopped_until_set_up_anew() {
    let vring = vring();
    let health = QueueHealth::default();
    vring.set_queue_next_avail(1);
    health.remember(&vring.get_ref());
    // A drain serves one more request, then finds the ring broken.
    vring.set_queue_next_avail(2);
    health.stop(&vring.get_ref(), 1, "test");
    assert_eq!(health.check_restart(&vring.get_ref()), QueueStart::Same);
    assert!(health.is_stopped(), "the next kick keeps it stopped");
    // The frontend sets the queue up again: it serves again.
    vring.set_queue_info(0x4000, 0x5000, 0x6000).unwrap();
    vring.set_queue_next_avail(0);
    assert_eq!(
        health.check_restart(&vring.get_ref()),
        QueueStart::NewDriver
    );
    assert!(!health.is_stopped());
}

#[test]
fn a_chain_is_answered_only_while_its_own_ring_runs() {
    let vring = vring();
    vring.set_queue_ready(true);
    vring.set_enabled(true);
    vring.set_queue_next_avail(5);
    let health = QueueHealth::default();
    // A drain popped a chain from the ring at 0 and remembered where it ended.
    health.remember(&vring.get_ref());
    let ring = health.ring(&vring.get_ref());
    let answer = || health.answer_to(&vring.get_ref(), ring);
    assert_eq!(answer(), Answer::Now);
    // Stopped by GET_VRING_BASE (or disabled): kept for later.
    vring.set_queue_ready(false);
    assert_eq!(answer(), Answer::Later);
    vring.set_queue_ready(true);
    vring.set_enabled(false);
    assert_eq!(answer(), Answer::Later);
    // Started again on the same rings where it stopped: answered.
    vring.set_enabled(true);
    assert_eq!(answer(), Answer::Now);
    // A new driver on the same addresses from index 0, before its first kick:
    // not the chain's ring.
    vring.set_queue_next_avail(0);
    assert_eq!(answer(), Answer::Never);
    // Its first kick sees the new driver; the old ring's chains stay unanswered
    // even once the new ring has moved on.
    assert_eq!(
        health.check_restart(&vring.get_ref()),
        QueueStart::NewDriver
    );
    health.remember(&vring.get_ref());
    vring.set_queue_next_avail(5);
    health.remember(&vring.get_ref());
    assert_eq!(answer(), Answer::Never);
    // A chain of the new ring is answered there, but not once the ring is set
    // up on other addresses, nor after a device reset.
    let ring = health.ring(&vring.get_ref());
    assert_eq!(health.answer_to(&vring.get_ref(), ring), Answer::Now);
    vring.set_queue_info(0x4000, 0x5000, 0x6000).unwrap();
    assert_eq!(health.answer_to(&vring.get_ref(), ring), Answer::Never);
    vring.set_queue_info(0, 0x1000, 0x2000).unwrap();
    assert_eq!(health.answer_to(&vring.get_ref(), ring), Answer::Now);
    health.ring_gone();
    assert_eq!(health.answer_to(&vring.get_ref(), ring), Answer::Never);
}

#[test]
fn a_looping_chain_is_broken() {
    let mem = memory();
    mem.write_slice(&header(Opcode::Getattr, 56), GuestAddress(0x10_0000))
        .unwrap();
    let q = MockSplitQueue::new(&mem, 16);
    // Descriptors 0 and 1 point at each other.
    let chain = q
        .build_multiple_desc_chains(&[desc(0x10_0000, 40, NEXT, 1), desc(0x10_0000, 40, NEXT, 0)])
        .unwrap();
    let mut buf = Vec::new();
    assert!(copy_request(&chain, &mut buf).is_err());
}
