//! Deterministic data pattern: the 8-byte word at byte offset `off` of a
//! stream with seed `seed` is a pure function of both (splitmix64), so any
//! block can be generated or checked on its own, in the daemon's reply or in
//! the host file. Same function as `fsops pattern` in the VM tests.

#[inline]
pub fn word(seed: u64, off: u64) -> u64 {
    let mut z = (off / 8).wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` (a multiple of 8 bytes, `off` 8-aligned) with the pattern.
pub fn fill(seed: u64, off: u64, buf: &mut [u8]) {
    for (i, chunk) in buf.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&word(seed, off + 8 * i as u64).to_ne_bytes());
    }
}

/// Checks `buf` against the pattern; returns the offset of the first bad word.
pub fn verify(seed: u64, off: u64, buf: &[u8]) -> Result<(), u64> {
    let mut bad = None;
    for (i, chunk) in buf.chunks_exact(8).enumerate() {
        let want = word(seed, off + 8 * i as u64).to_ne_bytes();
        if chunk != want {
            bad = Some(off + 8 * i as u64);
            break;
        }
    }
    if bad.is_none() && !buf.len().is_multiple_of(8) {
        bad = Some(off + (buf.len() / 8 * 8) as u64);
    }
    match bad {
        None => Ok(()),
        Some(at) => Err(at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_independent() {
        let mut whole = vec![0u8; 8192];
        fill(7, 0, &mut whole);
        let mut second = vec![0u8; 4096];
        fill(7, 4096, &mut second);
        assert_eq!(&whole[4096..], &second[..]);
        assert!(verify(7, 4096, &second).is_ok());
        assert_eq!(verify(8, 4096, &second), Err(4096));
        second[100] ^= 1;
        assert_eq!(verify(7, 4096, &second), Err(4096 + 96));
    }
}
