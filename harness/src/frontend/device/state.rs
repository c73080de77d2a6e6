//! One device-state transfer over a pipe (SET_DEVICE_STATE_FD, CHECK_DEVICE_STATE),
//! timed in its parts.

use std::time::Instant;

use vhost::vhost_user::message::{VhostTransferStateDirection, VhostTransferStatePhase};
use vhost::vhost_user::{Frontend, VhostUserFrontend};

use crate::frontend::error::{Error, Result};

use super::config::StateTransferTimes;

/// One device-state transfer over a pipe: a save returns the bytes read, a load
/// writes `state`. The outcome is CHECK_DEVICE_STATE's; the times are its parts'.
pub(crate) fn transfer_state(
    frontend: &mut Frontend,
    direction: VhostTransferStateDirection,
    state: Option<&[u8]>,
) -> Result<(Vec<u8>, StateTransferTimes)> {
    use std::io::{Read, Write};
    let name = format!("SET_DEVICE_STATE_FD {direction:?}");
    let io = |e| Error::io(format!("{name}: the pipe"), e);
    let (mut reader, mut writer) = std::io::pipe().map_err(io)?;
    let theirs = match direction {
        VhostTransferStateDirection::SAVE => {
            std::os::fd::OwnedFd::from(writer.try_clone().map_err(io)?)
        }
        VhostTransferStateDirection::LOAD => {
            std::os::fd::OwnedFd::from(reader.try_clone().map_err(io)?)
        }
    };
    // The frontend sends our copy of the pipe's end and closes it.
    let start = Instant::now();
    let replaced = frontend
        .set_device_state_fd(direction, VhostTransferStatePhase::STOPPED, theirs)
        .map_err(|e| Error::vhost(name.clone(), e))?;
    let set_fd = start.elapsed();
    let mut out = Vec::new();
    match direction {
        VhostTransferStateDirection::SAVE => {
            drop(writer);
            match replaced {
                Some(mut f) => f.read_to_end(&mut out).map_err(io)?,
                None => reader.read_to_end(&mut out).map_err(io)?,
            };
        }
        VhostTransferStateDirection::LOAD => {
            drop(reader);
            let bytes = state.unwrap_or_default();
            match replaced {
                Some(mut f) => f.write_all(bytes).map_err(io)?,
                None => writer.write_all(bytes).map_err(io)?,
            }
            drop(writer);
        }
    }
    let data = start.elapsed() - set_fd;
    frontend
        .check_device_state()
        .map_err(|e| Error::vhost("CHECK_DEVICE_STATE", e))?;
    let times = StateTransferTimes {
        set_fd,
        data,
        check: start.elapsed() - set_fd - data,
        bytes: match direction {
            VhostTransferStateDirection::SAVE => out.len(),
            VhostTransferStateDirection::LOAD => state.map_or(0, <[u8]>::len),
        },
    };
    Ok((out, times))
}
