//! The frontend's setup: what the frontend set up over vhost-user, kept by the keeper as
//! it relays, so that a new serving process can be set up the same way (see
//! `replay.rs`). Only messages that change the backend's state are kept, each with
//! its fds (the keeper's own copies: they stay open while the frontend stays connected).
//!
//! Fed the frontend's messages after they were forwarded, and the backend's replies
//! to them. A message the record cannot make sense of makes the setup
//! unreplayable (a hand-over is then refused, naming it); the relay goes on.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use vhost::vhost_user::message::FrontendReq;

use super::wire::Message;

/// A message the record cannot follow: the setup is then unreplayable (a new
/// serving process could not be set up as the frontend set this one up).
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum Unrecorded {
    /// A request vhost-user does not define.
    Unknown(u32),
    /// A request whose payload or fds are not as the protocol says: which part.
    Malformed {
        request: FrontendReq,
        what: &'static str,
    },
    /// A request that changes the backend's state in a way the record does not
    /// keep.
    NotRecorded(FrontendReq),
}

impl std::fmt::Display for Unrecorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unrecorded::Unknown(request) => write!(f, "unknown request {request}"),
            Unrecorded::Malformed { request, what } => write!(f, "{request:?}: {what}"),
            Unrecorded::NotRecorded(request) => write!(f, "{request:?} is not recorded"),
        }
    }
}

/// `SET_VRING_KICK`/`CALL`/`ERR`: the vring's index in bits 0–7; bit 8 says no fd
/// comes with it (a polled ring).
pub const VRING_IDX_MASK: u64 = 0xff;
pub const VRING_NOFD: u64 = 0x100;

/// One guest memory region, as `SET_MEM_TABLE` lists it and `ADD_MEM_REG` adds it.
#[derive(Debug)]
pub struct MemRegion {
    pub guest_phys_addr: u64,
    pub memory_size: u64,
    pub user_addr: u64,
    pub mmap_offset: u64,
    pub fd: OwnedFd,
}

impl MemRegion {
    /// Bytes of one region in `SET_MEM_TABLE` (and after `ADD_MEM_REG`'s padding).
    pub const LEN: usize = 32;

    fn decode(b: &[u8], fd: OwnedFd) -> MemRegion {
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        MemRegion {
            guest_phys_addr: w(0),
            memory_size: w(1),
            user_addr: w(2),
            mmap_offset: w(3),
            fd,
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        for w in [
            self.guest_phys_addr,
            self.memory_size,
            self.user_addr,
            self.mmap_offset,
        ] {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
}

/// An eventfd slot of a vring: the u64 as sent, and its fd unless `VRING_NOFD`.
#[derive(Debug)]
pub struct EventSlot {
    pub value: u64,
    pub fd: Option<OwnedFd>,
}

/// What the frontend set on one vring.
#[derive(Debug, Default)]
pub struct Vring {
    pub num: Option<u32>,
    /// `SET_VRING_ADDR`'s payload (VhostUserVringAddr, 40 bytes), as sent.
    pub addr: Option<Vec<u8>>,
    pub base: Option<u32>,
    pub kick: Option<EventSlot>,
    pub call: Option<EventSlot>,
    pub err: Option<EventSlot>,
    pub enabled: Option<bool>,
}

impl Vring {
    /// Whether the backend runs it: a kick fd set since the last stop.
    pub fn started(&self) -> bool {
        self.kick.is_some()
    }
}

/// A message kept whole with its fd (`SET_LOG_BASE`).
#[derive(Debug)]
pub struct Kept {
    pub payload: Vec<u8>,
    pub fd: Option<OwnedFd>,
}

/// What the frontend set up, as recorded.
#[derive(Debug, Default)]
pub struct FrontendSetup {
    pub owner: bool,
    pub features: Option<u64>,
    pub protocol_features: Option<u64>,
    pub regions: Vec<MemRegion>,
    pub vrings: BTreeMap<u32, Vring>,
    pub log_base: Option<Kept>,
    pub backend_req_fd: Option<OwnedFd>,
    /// The last `SET_CONFIG`'s payload.
    pub config: Option<Vec<u8>>,
    /// Why the setup cannot be replayed, if it cannot: the first message the
    /// record could not follow.
    pub unreplayable: Option<Unrecorded>,
}

impl FrontendSetup {
    pub fn new() -> FrontendSetup {
        FrontendSetup::default()
    }

    /// A spurious kick on vring `index` (its recorded kick eventfd), if it has one.
    pub fn nudge(&self, index: u32) {
        if let Some(fd) = self
            .vrings
            .get(&index)
            .and_then(|v| v.kick.as_ref())
            .and_then(|s| s.fd.as_ref())
        {
            let _ = nix::unistd::write(fd, &1u64.to_ne_bytes());
        }
    }

    /// Records a message the frontend sent (already forwarded), taking its fds.
    pub fn record(&mut self, msg: Message) {
        if let Err(why) = self.apply(msg) {
            if self.unreplayable.is_none() {
                self.unreplayable = Some(why);
            }
        }
    }

    /// Records the backend's reply to `request`: `GET_VRING_BASE` answers the index
    /// the ring stopped at, which is where the frontend starts it again.
    pub fn record_reply(&mut self, request: u32, reply: &Message) {
        if request == u32::from(FrontendReq::GET_VRING_BASE) {
            if let Some((index, num)) = reply.vring_state() {
                self.vrings.entry(index).or_default().base = Some(num);
            }
        }
    }

    fn apply(&mut self, msg: Message) -> Result<(), Unrecorded> {
        let Ok(req) = FrontendReq::try_from(msg.header.request) else {
            return Err(Unrecorded::Unknown(msg.header.request));
        };
        let bad = |what: &'static str| Unrecorded::Malformed { request: req, what };
        match req {
            FrontendReq::SET_OWNER => self.owner = true,
            FrontendReq::RESET_OWNER => *self = FrontendSetup::default(),
            FrontendReq::RESET_DEVICE => {
                self.features = None;
                for v in self.vrings.values_mut() {
                    v.enabled = Some(false);
                }
            }
            FrontendReq::SET_FEATURES => self.features = Some(msg.u64().ok_or(bad("payload"))?),
            FrontendReq::SET_PROTOCOL_FEATURES => {
                self.protocol_features = Some(msg.u64().ok_or(bad("payload"))?)
            }
            FrontendReq::SET_MEM_TABLE => self.set_mem_table(msg).map_err(bad)?,
            FrontendReq::ADD_MEM_REG => {
                let fd = single_fd(msg.fds).ok_or(bad("one fd"))?;
                let body = msg.payload.get(8..8 + MemRegion::LEN).ok_or(bad("payload"))?;
                self.regions.push(MemRegion::decode(body, fd));
            }
            FrontendReq::REM_MEM_REG => {
                let body = msg.payload.get(8..8 + 16).ok_or(bad("payload"))?;
                let gpa = u64::from_le_bytes(body[..8].try_into().unwrap());
                let size = u64::from_le_bytes(body[8..].try_into().unwrap());
                self.regions
                    .retain(|r| !(r.guest_phys_addr == gpa && r.memory_size == size));
            }
            FrontendReq::SET_VRING_NUM
            | FrontendReq::SET_VRING_BASE
            | FrontendReq::SET_VRING_ENABLE => {
                let (index, num) = msg.vring_state().ok_or(bad("payload"))?;
                let v = self.vrings.entry(index).or_default();
                match req {
                    FrontendReq::SET_VRING_NUM => v.num = Some(num),
                    FrontendReq::SET_VRING_BASE => v.base = Some(num),
                    _ => v.enabled = Some(num == 1),
                }
            }
            FrontendReq::SET_VRING_ADDR => {
                if msg.payload.len() != 40 {
                    return Err(bad("payload"));
                }
                let index = u32::from_le_bytes(msg.payload[..4].try_into().unwrap());
                self.vrings.entry(index).or_default().addr = Some(msg.payload);
            }
            FrontendReq::GET_VRING_BASE => {
                // The backend stops the ring and forgets its kick and call fds.
                let (index, _) = msg.vring_state().ok_or(bad("payload"))?;
                let v = self.vrings.entry(index).or_default();
                v.kick = None;
                v.call = None;
            }
            FrontendReq::SET_VRING_KICK
            | FrontendReq::SET_VRING_CALL
            | FrontendReq::SET_VRING_ERR => {
                let value = msg.u64().ok_or(bad("payload"))?;
                let fd = if value & VRING_NOFD != 0 {
                    None
                } else {
                    Some(single_fd(msg.fds).ok_or(bad("one fd"))?)
                };
                let v = self
                    .vrings
                    .entry((value & VRING_IDX_MASK) as u32)
                    .or_default();
                let slot = Some(EventSlot { value, fd });
                match req {
                    FrontendReq::SET_VRING_KICK => v.kick = slot,
                    FrontendReq::SET_VRING_CALL => v.call = slot,
                    _ => v.err = slot,
                }
            }
            FrontendReq::SET_LOG_BASE => {
                self.log_base = Some(Kept {
                    payload: msg.payload,
                    fd: single_fd(msg.fds),
                })
            }
            FrontendReq::SET_BACKEND_REQ_FD => self.backend_req_fd = single_fd(msg.fds),
            FrontendReq::SET_CONFIG => self.config = Some(msg.payload),
            // Questions, and the device state's transfer: they change nothing a new
            // backend must be told.
            FrontendReq::GET_FEATURES
            | FrontendReq::GET_PROTOCOL_FEATURES
            | FrontendReq::GET_QUEUE_NUM
            | FrontendReq::GET_CONFIG
            | FrontendReq::GET_MAX_MEM_SLOTS
            | FrontendReq::GET_INFLIGHT_FD
            // The keeper's own (handback.rs): never a serving process's.
            | FrontendReq::SET_INFLIGHT_FD
            | FrontendReq::GET_SHARED_OBJECT
            | FrontendReq::GET_SHMEM_CONFIG
            | FrontendReq::GET_STATUS
            | FrontendReq::SET_DEVICE_STATE_FD
            | FrontendReq::CHECK_DEVICE_STATE => {}
            other => return Err(Unrecorded::NotRecorded(other)),
        }
        Ok(())
    }

    fn set_mem_table(&mut self, msg: Message) -> Result<(), &'static str> {
        let count = msg
            .payload
            .get(..4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize)
            .ok_or("payload")?;
        if msg.payload.len() != 8 + count * MemRegion::LEN || msg.fds.len() != count {
            return Err("regions and fds do not match");
        }
        self.regions = msg
            .fds
            .into_iter()
            .enumerate()
            .map(|(i, fd)| MemRegion::decode(&msg.payload[8 + i * MemRegion::LEN..], fd))
            .collect();
        Ok(())
    }

    /// The vrings the backend runs, by index.
    pub fn started(&self) -> impl Iterator<Item = u32> + '_ {
        self.vrings
            .iter()
            .filter(|(_, v)| v.started())
            .map(|(&i, _)| i)
    }

    /// Whether the frontend negotiated the protocol feature `bit`.
    pub fn has_protocol(&self, bit: u64) -> bool {
        self.protocol_features.unwrap_or(0) & bit != 0
    }
}

fn single_fd(fds: Vec<OwnedFd>) -> Option<OwnedFd> {
    let mut it = fds.into_iter();
    match (it.next(), it.next()) {
        (Some(fd), None) => Some(fd),
        _ => None,
    }
}

/// The raw fd of a slot, if it has one.
pub fn slot_fd(slot: &EventSlot) -> Vec<RawFd> {
    slot.fd.iter().map(AsRawFd::as_raw_fd).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keeper::testing::eventfd;
    use crate::keeper::wire::{self, Header};

    /// The kick fd the record holds for vring `index`.
    fn kick_fd(s: &FrontendSetup, index: u32) -> std::os::fd::RawFd {
        let kick = s.vrings[&index].kick.as_ref().expect("a kick recorded");
        kick.fd.as_ref().expect("with an fd").as_raw_fd()
    }

    fn with_fds(request: FrontendReq, payload: Vec<u8>, fds: Vec<OwnedFd>) -> Message {
        Message {
            header: Header::request(u32::from(request), payload.len()),
            payload,
            fds,
        }
    }

    fn region(gpa: u64) -> Vec<u8> {
        [gpa, 0x1000, 0x7000_0000 + gpa, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect()
    }

    #[test]
    fn records_the_setup_and_its_changes() {
        let mut s = FrontendSetup::new();
        s.record(with_fds(FrontendReq::SET_OWNER, vec![], vec![]));
        s.record(with_fds(
            FrontendReq::SET_FEATURES,
            (1u64 << 30).to_le_bytes().to_vec(),
            vec![],
        ));
        let mut table = 2u64.to_le_bytes().to_vec();
        table.extend(region(0));
        table.extend(region(0x10_0000));
        s.record(with_fds(
            FrontendReq::SET_MEM_TABLE,
            table,
            vec![eventfd(), eventfd()],
        ));
        assert_eq!(s.regions.len(), 2);
        assert_eq!(s.regions[1].guest_phys_addr, 0x10_0000);
        s.record(with_fds(
            FrontendReq::SET_VRING_NUM,
            wire::vring_state(1, 128),
            vec![],
        ));
        let first_kick = eventfd();
        let first_raw = first_kick.as_raw_fd();
        s.record(with_fds(
            FrontendReq::SET_VRING_KICK,
            1u64.to_le_bytes().to_vec(),
            vec![first_kick],
        ));
        assert_eq!(kick_fd(&s, 1), first_raw);
        // The kick fd replaced: the record holds the new one, the old one is closed.
        let second = eventfd();
        let second_raw = second.as_raw_fd();
        s.record(with_fds(
            FrontendReq::SET_VRING_KICK,
            1u64.to_le_bytes().to_vec(),
            vec![second],
        ));
        assert_eq!(kick_fd(&s, 1), second_raw);
        assert_eq!(s.started().collect::<Vec<_>>(), vec![1]);
        // Polled: no fd.
        s.record(with_fds(
            FrontendReq::SET_VRING_CALL,
            (1 | VRING_NOFD).to_le_bytes().to_vec(),
            vec![],
        ));
        assert!(s.vrings[&1].call.as_ref().unwrap().fd.is_none());
        // A stop: kick and call are gone, the base comes with the reply.
        s.record(with_fds(
            FrontendReq::GET_VRING_BASE,
            wire::vring_state(1, 0),
            vec![],
        ));
        s.record_reply(
            u32::from(FrontendReq::GET_VRING_BASE),
            &Message::new(11, wire::vring_state(1, 42)),
        );
        assert!(!s.vrings[&1].started());
        assert_eq!(s.vrings[&1].base, Some(42));
        // Memory slots: one added, one removed.
        let mut add = 0u64.to_le_bytes().to_vec();
        add.extend(region(0x20_0000));
        s.record(with_fds(FrontendReq::ADD_MEM_REG, add, vec![eventfd()]));
        let mut rem = 0u64.to_le_bytes().to_vec();
        rem.extend(region(0));
        s.record(with_fds(FrontendReq::REM_MEM_REG, rem, vec![]));
        let gpas: Vec<u64> = s.regions.iter().map(|r| r.guest_phys_addr).collect();
        assert_eq!(gpas, vec![0x10_0000, 0x20_0000]);
        assert!(s.unreplayable.is_none(), "{:?}", s.unreplayable);
        assert!(s.owner && s.features == Some(1 << 30));
    }

    #[test]
    fn what_it_cannot_record_makes_it_unreplayable() {
        let mut s = FrontendSetup::new();
        // A mem table whose fds do not match its regions.
        let mut table = 1u64.to_le_bytes().to_vec();
        table.extend(region(0));
        s.record(with_fds(FrontendReq::SET_MEM_TABLE, table, vec![]));
        let why = s.unreplayable.unwrap();
        assert_eq!(
            why,
            Unrecorded::Malformed {
                request: FrontendReq::SET_MEM_TABLE,
                what: "regions and fds do not match"
            }
        );
        assert_eq!(
            why.to_string(),
            "SET_MEM_TABLE: regions and fds do not match"
        );
        let mut s = FrontendSetup::new();
        s.record(Message::new(0xffff, vec![]));
        assert_eq!(s.unreplayable, Some(Unrecorded::Unknown(0xffff)));
        assert_eq!(s.unreplayable.unwrap().to_string(), "unknown request 65535");
        let mut s = FrontendSetup::new();
        s.record(with_fds(
            FrontendReq::SET_VRING_KICK,
            0u64.to_le_bytes().to_vec(),
            vec![],
        ));
        assert_eq!(
            s.unreplayable,
            Some(Unrecorded::Malformed {
                request: FrontendReq::SET_VRING_KICK,
                what: "one fd"
            }),
            "a kick without its fd"
        );
        // The first one stays: a later message the record cannot follow does not
        // replace it.
        s.record(Message::new(0xffff, vec![]));
        assert!(matches!(s.unreplayable, Some(Unrecorded::Malformed { .. })));
        let mut s = FrontendSetup::new();
        s.record(with_fds(FrontendReq::POSTCOPY_ADVISE, vec![], vec![]));
        assert_eq!(
            s.unreplayable.unwrap().to_string(),
            "POSTCOPY_ADVISE is not recorded"
        );
    }
}
