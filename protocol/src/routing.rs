//! The routing contract: which shard owns an object.
//!
//! Server and shard-aware clients must compute exactly the same thing, so the
//! contract is small and fixed (see `docs/design.md`, "Routing contract"):
//!
//! ```text
//! h     = XXH3-64(seed, le_u16(len(bucket)) ++ bucket ++ key)
//! owner = (h * shard_count) >> 64          // multiply-shift, 128-bit product
//! ```
//!
//! The length prefix keeps `("ab", "c")` and `("a", "bc")` apart.
//! Multiply-shift maps the hash onto `[0, shard_count)` without a division and
//! keeps the distribution as uniform as the hash.

use xxhash_rust::xxh3::Xxh3;

/// Default seed ("percore1" in ASCII). A data directory records the seed it was
/// written with; clients learn it from the server's hello.
pub const HASH_SEED_DEFAULT: u64 = 0x7065_7263_6f72_6531;

/// Identifies the hash algorithm on the wire and in the data directory.
pub const HASH_ALGORITHM: &str = "xxh3-64/len16-bucket-key/multiply-shift";

/// Hard upper bound on shards per node; far above any core count we target.
pub const SHARD_COUNT_MAX: usize = 1024;

/// The stable 64-bit hash of (bucket, key).
#[must_use]
pub fn object_hash(seed: u64, bucket: &[u8], key: &[u8]) -> u64 {
    debug_assert!(bucket.len() <= u16::MAX as usize);
    let mut hasher = Xxh3::with_seed(seed);
    hasher.update(&(bucket.len() as u16).to_le_bytes());
    hasher.update(bucket);
    hasher.update(key);
    hasher.digest()
}

/// Maps a 64-bit hash onto `[0, shard_count)` by multiply-shift.
#[must_use]
pub fn shard_of_hash(hash: u64, shard_count: usize) -> usize {
    assert!(shard_count > 0 && shard_count <= SHARD_COUNT_MAX);
    let shard = ((u128::from(hash) * shard_count as u128) >> 64) as usize;
    debug_assert!(shard < shard_count);
    shard
}

/// The one placement function: the shard that owns `(bucket, key)`.
///
/// Every placement decision in server and client goes through here, so that a
/// later multi-node placement (node, shard) replaces a single function.
#[must_use]
pub fn owner_shard(seed: u64, shard_count: usize, bucket: &[u8], key: &[u8]) -> usize {
    shard_of_hash(object_hash(seed, bucket, key), shard_count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable() {
        // Pinned values: if these change, every existing data directory and
        // every deployed client breaks. Never update them casually.
        assert_eq!(
            object_hash(HASH_SEED_DEFAULT, b"bucket", b"key"),
            PINNED_BUCKET_KEY
        );
        assert_eq!(object_hash(0, b"", b""), PINNED_EMPTY);
    }

    const PINNED_BUCKET_KEY: u64 = 0x5dcd_05cf_acfd_11ce;
    const PINNED_EMPTY: u64 = 0x3325_230e_1f28_5505;

    #[test]
    fn length_prefix_separates_bucket_and_key() {
        let a = object_hash(1, b"ab", b"c");
        let b = object_hash(1, b"a", b"bc");
        assert_ne!(a, b);
    }

    #[test]
    fn multiply_shift_bounds_and_edges() {
        assert_eq!(shard_of_hash(0, 7), 0);
        assert_eq!(shard_of_hash(u64::MAX, 7), 6);
        assert_eq!(shard_of_hash(1 << 63, 2), 1);
        assert_eq!(shard_of_hash((1 << 63) - 1, 2), 0);
        for n in 1..=64 {
            for h in [0u64, 1, 12345, u64::MAX / 3, u64::MAX] {
                assert!(shard_of_hash(h, n) < n);
            }
        }
    }

    #[test]
    fn distribution_is_even() {
        let shard_count = 8;
        let mut counts = [0usize; 8];
        let keys_total = 80_000;
        for i in 0..keys_total {
            let key = format!("train/shard-{i:06}.tar");
            counts[owner_shard(HASH_SEED_DEFAULT, shard_count, b"data", key.as_bytes())] += 1;
        }
        let expected = keys_total / shard_count;
        for c in counts {
            // Within 5% of the mean: a broken hash or shift would skew this.
            assert!(c.abs_diff(expected) < expected / 20, "{counts:?}");
        }
    }
}
