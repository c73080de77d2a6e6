//! One virtqueue used as a FUSE channel: submit many chains, kick once, and
//! collect completions as the backend returns them. The synchronous `call`
//! used by tests is built on the same path.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::reply::{Completion, Reply};
use super::request::{opcode_name, ChainPart, RawChain, Request};
use crate::frontend::error::{Error, Result};
use crate::frontend::memory::{GuestBuffer, GuestMemory};
use crate::frontend::virtqueue::{Segment, SplitQueue};

/// How long synchronous calls wait for the backend by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Shared source of request ids. Steps by 2 like Linux, whose odd uniques are
/// reserved for FUSE_INTERRUPT.
#[derive(Clone, Debug, Default)]
pub struct UniqueSource(Arc<AtomicU64>);

impl UniqueSource {
    pub fn next(&self) -> u64 {
        self.0.fetch_add(2, Ordering::Relaxed) + 2
    }
}

/// A chain the backend owns: its buffers stay allocated until it comes back.
struct PendingChain {
    token: u64,
    opcode: Option<u32>,
    nodeid: u64,
    _readable: Vec<GuestBuffer>,
    /// Allocated writable buffers in chain order; raw segments are skipped
    /// (their contents are not ours to read).
    writable: Vec<GuestBuffer>,
}

/// A request queue (or the hiprio queue) driving FUSE traffic.
pub struct FuseQueue {
    queue: SplitQueue,
    memory: Arc<GuestMemory>,
    uniques: UniqueSource,
    pending: HashMap<u16, PendingChain>,
    /// Completions collected while waiting for a specific token.
    stashed: VecDeque<Completion>,
    timeout: Duration,
}

impl FuseQueue {
    pub fn new(queue: SplitQueue, memory: Arc<GuestMemory>, uniques: UniqueSource) -> Self {
        FuseQueue {
            queue,
            memory,
            uniques,
            pending: HashMap::new(),
            stashed: VecDeque::new(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The ring itself, for tests that play a driver breaking the rules.
    pub fn ring(&self) -> &SplitQueue {
        &self.queue
    }

    pub fn ring_mut(&mut self) -> &mut SplitQueue {
        &mut self.queue
    }

    /// Where this queue's request uniques come from (shared by the device's queues).
    pub fn uniques(&self) -> UniqueSource {
        self.uniques.clone()
    }

    /// vhost-user queue index (0 = hiprio).
    pub fn index(&self) -> u16 {
        self.queue.index()
    }

    /// Timeout for synchronous calls.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Chains submitted and not yet completed (including ones the backend dropped).
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Free descriptors left.
    pub fn free_descriptors(&self) -> usize {
        self.queue.free_descriptor_count()
    }

    /// Places a FUSE request in the ring without kicking; returns its unique.
    pub fn submit(&mut self, request: &Request) -> Result<u64> {
        let unique = self.uniques.next();
        self.add(
            unique,
            Some(request.opcode),
            request.nodeid,
            &request.to_chain(unique),
        )?;
        Ok(unique)
    }

    /// Places an arbitrary chain in the ring without kicking; returns its token.
    pub fn submit_chain(&mut self, chain: &RawChain) -> Result<u64> {
        let token = self.uniques.next();
        self.add(token, None, 0, chain)?;
        Ok(token)
    }

    /// Notifies the backend of everything submitted so far.
    pub fn kick(&mut self) -> Result<()> {
        self.queue.notify().map(|_| ())
    }

    /// Collects every completion available now, without blocking.
    pub fn poll_completions(&mut self) -> Result<Vec<Completion>> {
        let mut done: Vec<Completion> = self.stashed.drain(..).collect();
        while let Some(used) = self.queue.pop_used()? {
            done.push(self.complete(used.head, used.len)?);
        }
        Ok(done)
    }

    /// Blocks until at least one completion is available or `timeout` passes
    /// (then returns an empty list).
    pub fn wait_completions(&mut self, timeout: Duration) -> Result<Vec<Completion>> {
        let done = self.poll_completions()?;
        if !done.is_empty() {
            return Ok(done);
        }
        match self.queue.wait_used(timeout) {
            Ok(used) => {
                let mut done = vec![self.complete(used.head, used.len)?];
                done.extend(self.poll_completions()?);
                Ok(done)
            }
            Err(e) if e.is_timeout() => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Waits for the completion of `token`, keeping others for `poll_completions`.
    pub fn wait_for(&mut self, token: u64, timeout: Duration) -> Result<Completion> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(pos) = self.stashed.iter().position(|c| c.token == token) {
                return Ok(self.stashed.remove(pos).expect("position is valid"));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(Error::Timeout {
                    context: format!("queue {}: waiting for request {token}", self.index()),
                });
            }
            let used = self.queue.wait_used(remaining)?;
            let completion = self.complete(used.head, used.len)?;
            self.stashed.push_back(completion);
        }
    }

    /// Sends a FUSE request and waits for its validated reply.
    pub fn call(&mut self, request: &Request) -> Result<Reply> {
        let unique = self.submit(request)?;
        self.kick()?;
        self.wait_for(unique, self.timeout)?.into_reply()
    }

    /// Sends a request that has no reply (FORGET) and waits for the backend
    /// to hand the descriptors back, which it must do with used len 0.
    pub fn call_no_reply(&mut self, request: &Request) -> Result<()> {
        let unique = self.submit(request)?;
        self.kick()?;
        let done = self.wait_for(unique, self.timeout)?;
        if done.used_len != 0 {
            return Err(Error::bad_reply(
                format!("{} unique {unique}", opcode_name(request.opcode)),
                format!("no reply expected but used len is {}", done.used_len),
            ));
        }
        Ok(())
    }

    /// Sends a raw chain and waits for it to come back.
    pub fn call_chain(&mut self, chain: &RawChain) -> Result<Completion> {
        let token = self.submit_chain(chain)?;
        self.kick()?;
        self.wait_for(token, self.timeout)
    }

    /// Like `call`, but lets the caller rearrange the request's chain first
    /// (split buffers, insert 0-length or out-of-memory descriptors, drop the
    /// reply space). The completion is returned unvalidated: use
    /// [`Completion::into_reply`] to check it as a FUSE reply.
    pub fn call_reshaped(
        &mut self,
        request: &Request,
        reshape: impl FnOnce(RawChain) -> RawChain,
    ) -> Result<Completion> {
        let unique = self.uniques.next();
        let chain = reshape(request.to_chain(unique));
        self.add(unique, Some(request.opcode), request.nodeid, &chain)?;
        self.kick()?;
        self.wait_for(unique, self.timeout)
    }

    fn add(
        &mut self,
        token: u64,
        opcode: Option<u32>,
        nodeid: u64,
        chain: &RawChain,
    ) -> Result<()> {
        let (readable_segments, readable) = self.materialize(&chain.readable)?;
        let (writable_segments, writable) = self.materialize(&chain.writable)?;
        let head = self
            .queue
            .add_chain(&readable_segments, &writable_segments)?;
        self.pending.insert(
            head,
            PendingChain {
                token,
                opcode,
                nodeid,
                _readable: readable,
                writable,
            },
        );
        Ok(())
    }

    /// Allocates guest buffers for the parts and returns their segments.
    fn materialize(&self, parts: &[ChainPart]) -> Result<(Vec<Segment>, Vec<GuestBuffer>)> {
        let mut segments = Vec::with_capacity(parts.len());
        let mut buffers = Vec::new();
        for part in parts {
            let buf = match part {
                ChainPart::Raw(segment) => {
                    segments.push(*segment);
                    continue;
                }
                ChainPart::Data(bytes) => {
                    let buf = self.memory.alloc(bytes.len() as u64)?;
                    buf.write_at(0, bytes)?;
                    buf
                }
                ChainPart::Space(len) => self.memory.alloc(u64::from(*len))?,
            };
            segments.push(Segment::of(&buf));
            buffers.push(buf);
        }
        Ok((segments, buffers))
    }

    fn complete(&mut self, head: u16, used_len: u32) -> Result<Completion> {
        let chain = self.pending.remove(&head).ok_or_else(|| {
            Error::bad_reply(
                format!("queue {}", self.index()),
                format!("completion for unknown head {head}"),
            )
        })?;
        let mut written = Vec::with_capacity(used_len as usize);
        let mut left = u64::from(used_len);
        for buf in &chain.writable {
            let take = left.min(buf.len());
            written.extend(buf.read_at(0, take)?);
            left -= take;
        }
        Ok(Completion {
            token: chain.token,
            opcode: chain.opcode,
            nodeid: chain.nodeid,
            used_len,
            written,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_can_move_to_worker_threads() {
        fn assert_send<T: Send>() {}
        assert_send::<FuseQueue>();
    }

    #[test]
    fn uniques_are_even_and_shared() {
        let a = UniqueSource::default();
        let b = a.clone();
        assert_eq!((a.next(), b.next(), a.next()), (2, 4, 6));
    }
}
