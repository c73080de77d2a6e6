//! The journal's tests: every kind of record read back as written, counts changed in
//! place, slots reused, what fits nowhere, a record torn by a writer that died.

use super::records::Kind;
use super::*;
use crate::region::{Region, SlotClass};

fn journal() -> (&'static Region, Journal) {
    let region: &'static Region = Box::leak(Box::new(Region::create().unwrap()));
    (region, Journal::new(region, Half::A))
}

fn node<'a>(id: u64, name: &'a [u8], handle: Option<&'a [u8]>) -> Record<&'a [u8]> {
    Record::Node(NodeRecord {
        id,
        lookups: 1,
        parent: 1,
        name,
        volume: 1,
        file_type: libc::S_IFREG,
        dev: 7,
        ino: 8,
        mnt_id: 9,
        handle: handle.map(|bytes| Handle {
            handle_type: 0x81,
            bytes,
        }),
    })
}

fn owned(r: &Record<&[u8]>) -> Record<Vec<u8>> {
    match r {
        Record::Root { id, name } => Record::Root {
            id: *id,
            name: name.to_vec(),
        },
        Record::Node(n) => Record::Node(NodeRecord {
            id: n.id,
            lookups: n.lookups,
            parent: n.parent,
            name: n.name.to_vec(),
            volume: n.volume,
            file_type: n.file_type,
            dev: n.dev,
            ino: n.ino,
            mnt_id: n.mnt_id,
            handle: n.handle.as_ref().map(|h| Handle {
                handle_type: h.handle_type,
                bytes: h.bytes.to_vec(),
            }),
        }),
        Record::Handle {
            id,
            node,
            flags,
            flock,
        } => Record::Handle {
            id: *id,
            node: *node,
            flags: *flags,
            flock: *flock,
        },
        Record::Lock {
            node,
            owner,
            access,
            ranges,
        } => Record::Lock {
            node: *node,
            owner: *owner,
            access: *access,
            ranges: ranges.clone(),
        },
        Record::VirtualDir { id, path } => Record::VirtualDir {
            id: *id,
            path: path.to_vec(),
        },
    }
}

#[test]
fn every_kind_of_record_reads_back_as_written() {
    let (region, j) = journal();
    let records = [
        Record::Root {
            id: 2,
            name: b"rw/vol-a".as_slice(),
        },
        node(10, b"file.txt", Some(&[1, 2, 3, 4, 5, 6, 7, 8])),
        node(11, b"no-handle", None),
        Record::Handle {
            id: 3,
            node: 10,
            flags: libc::O_RDWR | libc::O_APPEND,
            flock: Some(libc::F_RDLCK),
        },
        Record::Lock {
            node: 10,
            owner: 0xdead_beef,
            access: libc::O_WRONLY,
            ranges: vec![
                (0, 99, libc::F_WRLCK),
                (200, i64::MAX as u64, libc::F_RDLCK),
            ],
        },
        Record::VirtualDir {
            id: 1 << 63 | 5,
            path: b"rw".as_slice(),
        },
    ];
    for r in &records {
        assert!(j.write(r).is_some(), "{r:?}");
    }
    let mut read: Vec<_> = read_half(region.half(Half::A));
    read.sort_by_key(|r| r.seq);
    let got: Vec<_> = read.into_iter().map(|r| r.record).collect();
    let want: Vec<_> = records.iter().map(owned).collect();
    assert_eq!(got, want);
    // The other half is untouched.
    assert!(read_half(region.half(Half::B)).is_empty());
}

#[test]
fn counts_change_in_place_and_freed_slots_are_reused() {
    let (region, j) = journal();
    let a = j.write(&node(10, b"a", None)).unwrap();
    j.write(&node(11, b"b", None)).unwrap();
    j.add_lookups(a, 4);
    let h = j
        .write(&Record::Handle {
            id: 1,
            node: 10,
            flags: libc::O_RDONLY,
            flock: None,
        })
        .unwrap();
    j.set_flock(h, libc::F_WRLCK);
    let read = read_half(region.half(Half::A));
    assert!(read.iter().any(|r| matches!(&r.record,
        Record::Node(n) if n.id == 10 && n.lookups == 5)));
    assert!(read
        .iter()
        .any(|r| matches!(&r.record, Record::Node(n) if n.id == 11)));
    assert!(read.iter().any(|r| r.record
        == Record::Handle {
            id: 1,
            node: 10,
            flags: libc::O_RDONLY,
            flock: Some(libc::F_WRLCK)
        }));
    j.set_flock(h, libc::F_UNLCK);
    j.free(a);
    j.free(a);
    let c = j.write(&node(13, b"c", None)).unwrap();
    assert_eq!(c, a, "the freed slot is reused, once");
    let d = j.write(&node(14, b"d", None)).unwrap();
    assert_ne!(d, a);
    let ids: Vec<u64> = read_half(region.half(Half::A))
        .iter()
        .filter_map(|r| match &r.record {
            Record::Node(n) => Some(n.id),
            _ => None,
        })
        .collect();
    assert_eq!(ids, [13, 11, 14]);
}

#[test]
fn a_long_name_takes_a_large_slot_and_what_fits_nowhere_is_not_recorded() {
    let (region, j) = journal();
    let long = vec![b'n'; 255];
    let s = j.write(&node(10, &long, Some(&[9; 8]))).unwrap();
    assert_eq!(s.class(), SlotClass::Large);
    // A node with a handle keeps its handle when the name cannot fit.
    let huge = vec![b'x'; 500];
    let s = j.write(&node(11, &huge, Some(&[9; 8]))).unwrap();
    let read = read_half(region.half(Half::A));
    let n11 = read
        .iter()
        .find_map(|r| match &r.record {
            Record::Node(n) if n.id == 11 => Some(n.clone()),
            _ => None,
        })
        .unwrap();
    assert!(n11.name.is_empty() && n11.handle.is_some());
    j.free(s);
    // Without a handle it cannot be found again: not recorded.
    assert!(j.write(&node(12, &huge, None)).is_none());
    let ranges = vec![(0u64, 1u64, libc::F_WRLCK); 40];
    let lock = Record::Lock {
        node: 1,
        owner: 2,
        access: 0,
        ranges,
    };
    assert!(j.write(&lock).is_none(), "more ranges than a slot holds");
}

#[test]
fn a_record_being_written_when_the_writer_died_reads_as_free() {
    let (region, j) = journal();
    let s = j.write(&node(10, b"a", None)).unwrap();
    // A new record half-written: the fields are there, the state word is not.
    let p = j.slot(s).unwrap();
    p.u32(STATE).store(FREE, Ordering::Relaxed);
    assert!(read_half(region.half(Half::A)).is_empty());
    // A slot whose lengths lie is skipped, not trusted.
    p.u32(META)
        .store(u32::from(Kind::Node as u8) | 200 << 8, Ordering::Relaxed);
    p.u32(STATE).store(LIVE, Ordering::Relaxed);
    assert!(read_half(region.half(Half::A)).is_empty());
    p.u32(META).store(0xff, Ordering::Relaxed);
    assert!(read_half(region.half(Half::A)).is_empty());
}
