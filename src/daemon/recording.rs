//! Where a serving process under a keeper sets up what it records the guest's
//! session into, in one place: the session region it shares with the keeper
//! (`src/region/`) and the journal half it writes (`fs/journal/`). Both live as long
//! as the process (leaked once here) and are handed to whoever records: the file
//! system's tables get the journal, the transport and the metrics get the region.
//! There is no global for either.

use std::os::fd::{FromRawFd, OwnedFd};

use crate::config::KeeperRegion;
use crate::fs::journal::Journal;
use crate::region::{Half, Region};

use super::error::DaemonError;

/// The region and the journal half of a serving process under a keeper.
#[derive(Clone, Copy)]
pub struct Recording {
    pub region: &'static Region,
    pub journal: &'static Journal,
}

impl Recording {
    /// A serving process records into `half` of `region` from now until it exits.
    pub fn start(region: Region, half: Half) -> Recording {
        let region: &'static Region = Box::leak(Box::new(region));
        let journal: &'static Journal = Box::leak(Box::new(Journal::new(region, half)));
        Recording { region, journal }
    }

    /// A serving process the keeper started (after an upgrade or a crash): the
    /// region's fd and the half it records into came on its command line.
    pub fn inherited(k: &KeeperRegion) -> Result<Recording, DaemonError> {
        // SAFETY: the keeper passed this fd for exactly this use; owned once, here.
        let fd = unsafe { OwnedFd::from_raw_fd(k.fd) };
        let region = Region::open(fd).map_err(DaemonError::Region)?;
        Ok(Recording::start(region, k.journal))
    }

    /// The first serving process, forked off by the keeper: it shares the region
    /// through the fork and records into half A.
    pub fn forked(region: Region) -> Recording {
        Recording::start(region, Half::A)
    }
}
