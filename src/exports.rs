//! What the daemon's harness (integration tests, benches, the load generator), its
//! fuzz targets and its man page generator reach: the one deliberate door into the
//! crate, laid out as the modules it comes from. Everything else is crate-private,
//! so the compiler reports what nothing uses.

pub mod config {
    pub use crate::config::{parse_allowed_dirs, split_access, Args};
}

pub mod control {
    pub use crate::control::Api;

    pub mod client {
        pub use crate::control::client::CtlArgs;
    }

    pub mod http {
        pub use crate::control::http::{read_request, reason, ReadError};
    }
}

/// The device's queue serving, driven by the `virtqueue` fuzz target and benches.
pub mod device {
    pub use crate::device::{DeviceStats, GuestMem, GuestMmap, Vring, MAX_QUEUE_SIZE};

    pub mod inflight {
        pub use crate::device::inflight::InFlight;
    }

    pub mod poll {
        pub use crate::device::poll::Poller;
    }

    pub mod later {
        pub use crate::device::later::{Later, Parked, WaitRoom, WakeTimer};
    }

    pub mod queue {
        pub use crate::device::queue::{process, QueueRef};
    }

    pub mod request {
        pub use crate::device::guest_buffers::Broken;
        pub use crate::device::request::serve_popped;
    }

    pub mod ring {
        pub use crate::device::ring::{QueueCounters, QueueHealth, RingRef};
    }
}

/// The file system stack, driven in-process by tests, benches and fuzz targets.
pub mod fs {
    pub use crate::fs::{
        build, resolve_share_path, CacheMode, CopyRange, ExtraOps, FsServer, PassthroughConfig,
        SharePath, ShareSpec, Stack, VolFs,
    };

    pub mod file_handle {
        pub use crate::fs::file_handle::FileHandleMode;
    }

    pub mod names {
        pub use crate::fs::names::valid_volume_name;
    }

    pub mod passthrough {
        pub mod state {
            pub use crate::fs::passthrough::state::HandedFiles;
        }
    }
}

/// The table of FUSE operations (the harness checks every row volfsd decodes has its
/// handler).
pub mod fuse_ops {
    pub use crate::fuse_ops::{opcode, row, Admission, Decoder, Row, ROWS};
}

pub mod logging {
    pub use crate::logging::{Budget, BUDGET, BUDGET_REPORT, DEBUG_BUDGET};
}

/// The session region a keeper shares with its serving processes and a frontend
/// keeps across a restart (tests write a hostile one; a fuzz target reads them).
pub mod region {
    pub use crate::device::inflight::unanswered_in;
    pub use crate::fs::journal::Journal;
    pub use crate::region::{Half, Region, AREAS, MAX_QUEUES, QUEUE_SIZE};

    /// The journal half `half` of `region`, for a stack to record the guest's session
    /// into as a serving process under a keeper does (`PassthroughConfig::journal`;
    /// the fuzz seeds are regions a real stack wrote). Both live until the process
    /// exits.
    pub fn record_into(region: Region, half: Half) -> (&'static Region, &'static Journal) {
        let region: &'static Region = Box::leak(Box::new(region));
        (region, Box::leak(Box::new(Journal::new(region, half))))
    }
}

pub mod sandbox {
    pub use crate::sandbox::{SeccompMode, ThreadRole};

    pub mod seccomp {
        pub use crate::sandbox::seccomp::{apply, role_programs};
    }

    pub mod caps {
        pub use crate::sandbox::caps::kept;
    }

    pub mod threads {
        pub use crate::sandbox::threads::LAUNCHER_NAME;
    }
}

pub mod state {
    pub use crate::state::{LoadOptions, OnError};

    pub mod format {
        pub use crate::state::format::{
            decode, decode_preview, decode_upgrade, encode, encode_upgrade, kind, FileHandle,
            GuestView, Handoff, Kind, Location, Lock, ParkedRequest, Previewed, SessionState,
            UpgradeState, VirtualDir,
        };
    }
}
