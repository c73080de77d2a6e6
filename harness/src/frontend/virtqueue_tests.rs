//! Ring arithmetic checked against a fake device that reads the avail ring and
//! writes the used ring directly in guest memory.

use super::*;

/// A descriptor as the device sees it: (addr, len, flags).
type RawDesc = (u64, u32, u16);

/// Minimal device side of a split ring, enough to consume and complete chains.
struct FakeDevice {
    desc_table: GuestAddress,
    avail_ring: GuestAddress,
    used_ring: GuestAddress,
    size: u16,
    next_avail: u16,
    next_used: u16,
}

impl FakeDevice {
    fn attach(q: &SplitQueue) -> Self {
        FakeDevice {
            desc_table: q.desc_table,
            avail_ring: q.avail_ring,
            used_ring: q.used_ring,
            size: q.size,
            next_avail: 0,
            next_used: 0,
        }
    }

    /// Pops one available chain: (head, [(addr, len, flags)]).
    fn pop_avail(&mut self, mem: &GuestMemory) -> Option<(u16, Vec<RawDesc>)> {
        let m = mem.mmap();
        let idx: u16 = m.read_obj(self.avail_ring.unchecked_add(2)).unwrap();
        if idx == self.next_avail {
            return None;
        }
        let slot = u64::from(self.next_avail % self.size);
        let head: u16 = m
            .read_obj(self.avail_ring.unchecked_add(4 + 2 * slot))
            .unwrap();
        self.next_avail = self.next_avail.wrapping_add(1);
        let mut chain = Vec::new();
        let mut i = head;
        loop {
            let d = self.desc_table.unchecked_add(16 * u64::from(i));
            let addr: u64 = m.read_obj(d).unwrap();
            let len: u32 = m.read_obj(d.unchecked_add(8)).unwrap();
            let flags: u16 = m.read_obj(d.unchecked_add(12)).unwrap();
            let next: u16 = m.read_obj(d.unchecked_add(14)).unwrap();
            chain.push((addr, len, flags));
            if flags & VIRTQ_DESC_F_NEXT == 0 {
                break;
            }
            i = next;
        }
        Some((head, chain))
    }

    fn push_used(&mut self, mem: &GuestMemory, head: u16, len: u32) {
        let m = mem.mmap();
        let slot = u64::from(self.next_used % self.size);
        let e = self.used_ring.unchecked_add(4 + 8 * slot);
        m.write_obj(u32::from(head), e).unwrap();
        m.write_obj(len, e.unchecked_add(4)).unwrap();
        self.next_used = self.next_used.wrapping_add(1);
        m.write_obj(self.next_used, self.used_ring.unchecked_add(2))
            .unwrap();
    }
}

fn seg(addr: u64, len: u32) -> Segment {
    Segment::new(GuestAddress(addr), len)
}

#[test]
fn layout_respects_alignment() {
    let l = RingLayout::for_size(256);
    assert_eq!(l.avail_offset, 4096);
    assert_eq!(l.used_offset % 4, 0);
    assert!(l.used_offset >= 4096 + 4 + 512 + 2);
    assert_eq!(l.total, l.used_offset + 4 + 8 * 256 + 2);
}

#[test]
fn rejects_bad_sizes_and_empty_chains() {
    let mem = GuestMemory::new(1 << 20).unwrap();
    assert!(SplitQueue::new(&mem, 0, 3).is_err());
    assert!(SplitQueue::new(&mem, 0, 0).is_err());
    let mut q = SplitQueue::new(&mem, 0, 4).unwrap();
    assert!(matches!(
        q.add_chain(&[], &[]),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn chain_layout_flags_and_order() {
    let mem = GuestMemory::new(1 << 20).unwrap();
    let mut q = SplitQueue::new(&mem, 1, 8).unwrap();
    let mut dev = FakeDevice::attach(&q);
    let head = q
        .add_chain(&[seg(0x1000, 40), seg(0x2000, 8)], &[seg(0x3000, 16)])
        .unwrap();
    assert!(q.notify().unwrap());
    assert_eq!(q.kick_eventfd().read().unwrap(), 1);
    let (dev_head, chain) = dev.pop_avail(&mem).unwrap();
    assert_eq!(dev_head, head);
    assert_eq!(
        chain,
        vec![
            (0x1000, 40, VIRTQ_DESC_F_NEXT),
            (0x2000, 8, VIRTQ_DESC_F_NEXT),
            (0x3000, 16, VIRTQ_DESC_F_WRITE),
        ]
    );
    assert_eq!(q.free_descriptor_count(), 5);
    assert_eq!(q.pop_used().unwrap(), None);
    dev.push_used(&mem, head, 16);
    assert_eq!(q.pop_used().unwrap(), Some(UsedElement { head, len: 16 }));
    assert_eq!(q.free_descriptor_count(), 8);
}

#[test]
fn indices_wrap_and_out_of_order_completion() {
    let mem = GuestMemory::new(1 << 20).unwrap();
    let mut q = SplitQueue::new(&mem, 1, 4).unwrap();
    let mut dev = FakeDevice::attach(&q);
    // 70000 chains: the u16 indices wrap at least once.
    for round in 0..35000u32 {
        let a = q.add_chain(&[seg(0x1000, 1)], &[seg(0x2000, 4)]).unwrap();
        let b = q.add_chain(&[seg(0x1000, 1)], &[seg(0x2000, 4)]).unwrap();
        assert!(matches!(
            q.add_chain(&[seg(0, 1), seg(0, 1)], &[seg(0, 1)]),
            Err(Error::QueueFull {
                needed: 3,
                free: 0,
                ..
            })
        ));
        let (ha, _) = dev.pop_avail(&mem).unwrap();
        let (hb, _) = dev.pop_avail(&mem).unwrap();
        assert_eq!((ha, hb), (a, b));
        // Complete in reverse order.
        dev.push_used(&mem, hb, round % 5);
        dev.push_used(&mem, ha, 4);
        assert_eq!(q.pop_used().unwrap().unwrap().head, b);
        assert_eq!(q.pop_used().unwrap().unwrap().head, a);
        assert_eq!(q.pop_used().unwrap(), None);
    }
    assert_eq!(q.in_flight_count(), 0);
}

#[test]
fn bogus_used_entries_are_errors() {
    let mem = GuestMemory::new(1 << 20).unwrap();
    let mut q = SplitQueue::new(&mem, 2, 4).unwrap();
    let mut dev = FakeDevice::attach(&q);
    let head = q.add_chain(&[seg(0x1000, 1)], &[seg(0x2000, 4)]).unwrap();
    dev.pop_avail(&mem).unwrap();
    dev.push_used(&mem, 3, 0); // never submitted
    assert!(matches!(q.pop_used(), Err(Error::BadReply { .. })));
    dev.push_used(&mem, head, 5); // more than the 4 writable bytes
    assert!(matches!(q.pop_used(), Err(Error::BadReply { .. })));
    assert_eq!(
        q.in_flight_count(),
        0,
        "descriptors freed despite the error"
    );
}

#[test]
fn wait_used_times_out_without_device() {
    let mem = GuestMemory::new(1 << 20).unwrap();
    let mut q = SplitQueue::new(&mem, 1, 4).unwrap();
    q.add_chain(&[seg(0x1000, 1)], &[]).unwrap();
    let err = q.wait_used(Duration::from_millis(20)).unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(err.to_string().contains("queue 1"));
}

#[test]
fn event_idx_kick_suppression() {
    assert!(need_event(0, 1, 0));
    assert!(!need_event(5, 3, 0));
    assert!(need_event(65535, 0, 65534), "wraps");
    let mem = GuestMemory::new(1 << 20).unwrap();
    let mut q = SplitQueue::new(&mem, 1, 8).unwrap();
    q.set_event_idx(true);
    // Device says: kick me when avail idx passes 2.
    mem.mmap().write_obj(2u16, q.avail_event_addr()).unwrap();
    q.add_chain(&[seg(0x1000, 1)], &[]).unwrap();
    assert!(!q.notify().unwrap(), "idx 1 does not pass event 2");
    q.add_chain(&[seg(0x1000, 1)], &[]).unwrap();
    q.add_chain(&[seg(0x1000, 1)], &[]).unwrap();
    assert!(q.notify().unwrap(), "idx 3 passes event 2");
}
