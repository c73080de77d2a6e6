//! FUSE client over virtio-fs queues.
//!
//! - [`Request`] / [`RawChain`]: what is sent, well-formed or not.
//! - [`FuseQueue`]: one virtqueue; `submit`/`kick`/`poll_completions` for many
//!   requests in flight, `call` for one at a time.
//! - [`FuseOps`]: typed operations (lookup, create, read, ...) on any channel.
//! - [`FuseClient`]: hiprio + request queues of one device, with INIT.

mod client;
mod ops;
mod queue;
mod reply;
mod request;

pub use client::FuseClient;
pub use ops::{FuseOps, InitParams, XattrReply};
pub use queue::{FuseQueue, UniqueSource, DEFAULT_TIMEOUT};
pub use reply::{parse_direntplus, parse_dirents, Completion, DirEntry, DirEntryPlus, Reply};
pub use request::{
    c_string, opcode_name, ChainPart, RawChain, Request, IN_HEADER_SIZE, OUT_HEADER_SIZE,
};
