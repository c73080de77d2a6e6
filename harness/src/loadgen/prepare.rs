//! Host-side preparation: the read file and the directory the workloads use, the
//! write file, and the check of what the writes left on the host.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::workloads::{entry_name, entry_size, SEED_READ, SEED_WRITE};
use super::{pattern, Error, LgResult, Options, DIR_10K, LARGE_BLOCK, READ_FILE, WRITE_FILE};

/// The read file: `file_size` bytes of pattern SEED_READ. Reused when it has
/// the right size and sampled blocks verify; then read once so the page cache
/// is warm for every daemon alike.
pub(super) fn prepare_read_file(opts: &Options, wd: &Path) -> LgResult<()> {
    let path = wd.join(READ_FILE);
    let mut buf = vec![0u8; LARGE_BLOCK];
    let reuse = match File::open(&path) {
        Ok(f) if f.metadata().map(|m| m.len()).unwrap_or(0) == opts.file_size => {
            let mut ok = true;
            for i in 0..16u64 {
                let off = (opts.file_size / 16 * i) / 4096 * 4096;
                let n = 4096.min(opts.file_size - off) as usize;
                if f.read_exact_at(&mut buf[..n], off).is_err()
                    || pattern::verify(SEED_READ, off, &buf[..n]).is_err()
                {
                    ok = false;
                    break;
                }
            }
            ok
        }
        _ => false,
    };
    if !reuse {
        say(
            opts,
            &format!("preparing {} ({} bytes)", path.display(), opts.file_size),
        );
        let mut f = File::create(&path).map_err(Error::at(&path))?;
        let mut off = 0;
        while off < opts.file_size {
            let n = (LARGE_BLOCK as u64).min(opts.file_size - off) as usize;
            pattern::fill(SEED_READ, off, &mut buf[..n]);
            f.write_all(&buf[..n]).map_err(Error::at(&path))?;
            off += n as u64;
        }
        f.sync_all().map_err(Error::at(&path))?;
    }
    // Warm the host page cache: both daemons then read from memory.
    let mut f = File::open(&path).map_err(Error::at(&path))?;
    while f.read(&mut buf).map_err(Error::at(&path))? > 0 {}
    Ok(())
}

pub(super) fn prepare_write_file(opts: &Options, wd: &Path) -> LgResult<PathBuf> {
    let path = wd.join(WRITE_FILE);
    let _ = fs::remove_file(&path);
    let f = File::create(&path).map_err(Error::at(&path))?;
    f.set_len(opts.file_size).map_err(Error::at(&path))?;
    Ok(path)
}

/// Every block the workload wrote must hold the pattern, every other one zeros.
pub(super) fn verify_write_file(
    path: &Path,
    file_size: u64,
    written: &[AtomicU64],
) -> LgResult<u64> {
    let mut f = File::open(path).map_err(Error::at(path))?;
    let mut buf = vec![0u8; LARGE_BLOCK];
    let mut off = 0u64;
    let mut blocks_written = 0;
    while off < file_size {
        let n = (LARGE_BLOCK as u64).min(file_size - off) as usize;
        f.read_exact(&mut buf[..n]).map_err(Error::at(path))?;
        for (i, block) in buf[..n].chunks(4096).enumerate() {
            let boff = off + 4096 * i as u64;
            let blk = boff / 4096;
            let was_written =
                written[(blk / 64) as usize].load(Ordering::Relaxed) & (1 << (blk % 64)) != 0;
            if was_written {
                blocks_written += 1;
                if let Err(at) = pattern::verify(SEED_WRITE, boff, block) {
                    return Err(Error::WrongData {
                        path: path.to_path_buf(),
                        block: boff,
                        at,
                    });
                }
            } else if block.iter().any(|&b| b != 0) {
                return Err(Error::NotZero {
                    path: path.to_path_buf(),
                    block: boff,
                });
            }
        }
        off += n as u64;
    }
    Ok(blocks_written)
}

/// The directory of `files` entries, file i holding `entry_size(i)` bytes.
pub(super) fn prepare_dir(opts: &Options, wd: &Path) -> LgResult<()> {
    let dir = wd.join(DIR_10K);
    let complete = fs::read_dir(&dir)
        .map(|rd| rd.count() == opts.files)
        .unwrap_or(false)
        && (0..opts.files).step_by(97).all(|i| {
            fs::metadata(dir.join(entry_name(i))).map(|m| m.len()).ok() == Some(entry_size(i))
        });
    if complete {
        return Ok(());
    }
    say(
        opts,
        &format!("preparing {} ({} files)", dir.display(), opts.files),
    );
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(Error::at(&dir))?;
    let data = vec![b'x'; 512];
    for i in 0..opts.files {
        let p = dir.join(entry_name(i));
        let mut f = File::create(&p).map_err(Error::at(&p))?;
        f.write_all(&data[..entry_size(i) as usize])
            .map_err(Error::at(&p))?;
    }
    Ok(())
}

pub(super) fn say(opts: &Options, msg: &str) {
    if !opts.quiet {
        eprintln!("loadgen: {msg}");
    }
}
