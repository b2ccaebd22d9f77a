//! MD5 (RFC 1321) for ETags, with a multi-buffer kernel: the whole blocks
//! of up to 16 independent streams are hashed at once in the lanes of
//! AVX-512 registers (one stream per 32-bit lane), where a lone stream runs
//! at the speed of one lane. A shard has many uploads going at once, so
//! their blocks can share the vector unit (`engine` batches them).
//!
//! `Md5Stream` is an incremental hasher whose whole blocks may be handed
//! to `compress_many` together with other streams' blocks; the scalar
//! `compress` is the reference and the fallback on CPUs without AVX-512.
//! Tests check both against the md-5 crate on random inputs and lengths.

/// Bytes per MD5 block.
pub const BLOCK_BYTES: usize = 64;

/// floor(|sin(i + 1)| * 2^32).
const K: [u32; 64] = [
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391,
];

// Shifts and message words per step (RFC 1321) are written into the
// unrolled steps below: shifts 7 12 17 22 / 5 9 14 20 / 4 11 16 23 /
// 6 10 15 21 by round; word i, (5i + 1), (3i + 5), 7i (mod 16).

/// The 64 steps of an MD5 block (RFC 1321), unrolled: round function,
/// the registers (they rotate by renaming instead of moving), message
/// word, shift and step index, for a `$step` macro of that shape (scalar
/// and AVX-512 below).
macro_rules! md5_steps {
    ($step:ident, $a:ident, $b:ident, $c:ident, $d:ident) => {
        $step!(F, $a, $b, $c, $d, 0, 7, 0);
        $step!(F, $d, $a, $b, $c, 1, 12, 1);
        $step!(F, $c, $d, $a, $b, 2, 17, 2);
        $step!(F, $b, $c, $d, $a, 3, 22, 3);
        $step!(F, $a, $b, $c, $d, 4, 7, 4);
        $step!(F, $d, $a, $b, $c, 5, 12, 5);
        $step!(F, $c, $d, $a, $b, 6, 17, 6);
        $step!(F, $b, $c, $d, $a, 7, 22, 7);
        $step!(F, $a, $b, $c, $d, 8, 7, 8);
        $step!(F, $d, $a, $b, $c, 9, 12, 9);
        $step!(F, $c, $d, $a, $b, 10, 17, 10);
        $step!(F, $b, $c, $d, $a, 11, 22, 11);
        $step!(F, $a, $b, $c, $d, 12, 7, 12);
        $step!(F, $d, $a, $b, $c, 13, 12, 13);
        $step!(F, $c, $d, $a, $b, 14, 17, 14);
        $step!(F, $b, $c, $d, $a, 15, 22, 15);
        $step!(G, $a, $b, $c, $d, 1, 5, 16);
        $step!(G, $d, $a, $b, $c, 6, 9, 17);
        $step!(G, $c, $d, $a, $b, 11, 14, 18);
        $step!(G, $b, $c, $d, $a, 0, 20, 19);
        $step!(G, $a, $b, $c, $d, 5, 5, 20);
        $step!(G, $d, $a, $b, $c, 10, 9, 21);
        $step!(G, $c, $d, $a, $b, 15, 14, 22);
        $step!(G, $b, $c, $d, $a, 4, 20, 23);
        $step!(G, $a, $b, $c, $d, 9, 5, 24);
        $step!(G, $d, $a, $b, $c, 14, 9, 25);
        $step!(G, $c, $d, $a, $b, 3, 14, 26);
        $step!(G, $b, $c, $d, $a, 8, 20, 27);
        $step!(G, $a, $b, $c, $d, 13, 5, 28);
        $step!(G, $d, $a, $b, $c, 2, 9, 29);
        $step!(G, $c, $d, $a, $b, 7, 14, 30);
        $step!(G, $b, $c, $d, $a, 12, 20, 31);
        $step!(H, $a, $b, $c, $d, 5, 4, 32);
        $step!(H, $d, $a, $b, $c, 8, 11, 33);
        $step!(H, $c, $d, $a, $b, 11, 16, 34);
        $step!(H, $b, $c, $d, $a, 14, 23, 35);
        $step!(H, $a, $b, $c, $d, 1, 4, 36);
        $step!(H, $d, $a, $b, $c, 4, 11, 37);
        $step!(H, $c, $d, $a, $b, 7, 16, 38);
        $step!(H, $b, $c, $d, $a, 10, 23, 39);
        $step!(H, $a, $b, $c, $d, 13, 4, 40);
        $step!(H, $d, $a, $b, $c, 0, 11, 41);
        $step!(H, $c, $d, $a, $b, 3, 16, 42);
        $step!(H, $b, $c, $d, $a, 6, 23, 43);
        $step!(H, $a, $b, $c, $d, 9, 4, 44);
        $step!(H, $d, $a, $b, $c, 12, 11, 45);
        $step!(H, $c, $d, $a, $b, 15, 16, 46);
        $step!(H, $b, $c, $d, $a, 2, 23, 47);
        $step!(I, $a, $b, $c, $d, 0, 6, 48);
        $step!(I, $d, $a, $b, $c, 7, 10, 49);
        $step!(I, $c, $d, $a, $b, 14, 15, 50);
        $step!(I, $b, $c, $d, $a, 5, 21, 51);
        $step!(I, $a, $b, $c, $d, 12, 6, 52);
        $step!(I, $d, $a, $b, $c, 3, 10, 53);
        $step!(I, $c, $d, $a, $b, 10, 15, 54);
        $step!(I, $b, $c, $d, $a, 1, 21, 55);
        $step!(I, $a, $b, $c, $d, 8, 6, 56);
        $step!(I, $d, $a, $b, $c, 15, 10, 57);
        $step!(I, $c, $d, $a, $b, 6, 15, 58);
        $step!(I, $b, $c, $d, $a, 13, 21, 59);
        $step!(I, $a, $b, $c, $d, 4, 6, 60);
        $step!(I, $d, $a, $b, $c, 11, 10, 61);
        $step!(I, $c, $d, $a, $b, 2, 15, 62);
        $step!(I, $b, $c, $d, $a, 9, 21, 63);
    };
}

const INIT: [u32; 4] = [0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476];

/// Hashes whole blocks into `state` (the reference implementation).
pub fn compress(state: &mut [u32; 4], blocks: &[u8]) {
    debug_assert_eq!(blocks.len() % BLOCK_BYTES, 0);
    for block in blocks.chunks_exact(BLOCK_BYTES) {
        let mut m = [0u32; 16];
        for (w, bytes) in m.iter_mut().zip(block.chunks_exact(4)) {
            *w = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        }
        // One step: `$a = $b + rotl($a + f($b, $c, $d) + K[$i] + m[$w], $s)`.
        macro_rules! step {
            (F, $a:ident, $b:ident, $c:ident, $d:ident, $w:expr, $s:expr, $i:expr) => {
                step!(@ ($d ^ ($b & ($c ^ $d))), $a, $b, $w, $s, $i)
            };
            (G, $a:ident, $b:ident, $c:ident, $d:ident, $w:expr, $s:expr, $i:expr) => {
                step!(@ ($c ^ ($d & ($b ^ $c))), $a, $b, $w, $s, $i)
            };
            (H, $a:ident, $b:ident, $c:ident, $d:ident, $w:expr, $s:expr, $i:expr) => {
                step!(@ ($b ^ $c ^ $d), $a, $b, $w, $s, $i)
            };
            (I, $a:ident, $b:ident, $c:ident, $d:ident, $w:expr, $s:expr, $i:expr) => {
                step!(@ ($c ^ ($b | !$d)), $a, $b, $w, $s, $i)
            };
            (@ $f:expr, $a:ident, $b:ident, $w:expr, $s:expr, $i:expr) => {
                $a = $b.wrapping_add(
                    $a.wrapping_add($f)
                        .wrapping_add(K[$i])
                        .wrapping_add(m[$w])
                        .rotate_left($s),
                )
            };
        }
        let [mut a, mut b, mut c, mut d] = *state;
        md5_steps!(step, a, b, c, d);
        state[0] = state[0].wrapping_add(a);
        state[1] = state[1].wrapping_add(b);
        state[2] = state[2].wrapping_add(c);
        state[3] = state[3].wrapping_add(d);
    }
}

/// One stream's whole blocks for `compress_many`.
pub struct Job<'a> {
    pub state: &'a mut [u32; 4],
    /// The stream's next bytes, hashed in order; each slice a multiple of
    /// `BLOCK_BYTES` long.
    pub slices: Vec<&'a [u8]>,
}

/// Whether this CPU runs the 16-lane kernel (`PERCORE_MD5_LANES=off` in
/// the environment turns it off, for comparisons).
pub fn lanes_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static LANES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *LANES.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::env::var("PERCORE_MD5_LANES").map_or(true, |v| v != "off")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Hashes every job's blocks into its state: in the lanes of the vector
/// unit where the CPU has them (two jobs or more), else one after another.
pub fn compress_many(jobs: &mut [Job<'_>]) {
    for j in jobs.iter() {
        for slice in &j.slices {
            assert_eq!(slice.len() % BLOCK_BYTES, 0, "whole blocks only");
        }
    }
    #[cfg(target_arch = "x86_64")]
    if jobs.len() > 1 && lanes_available() {
        // SAFETY: the CPU has AVX-512F (checked above); every job's blocks
        // are whole (asserted above), which is all `x16::run` reads.
        unsafe { x16::run(jobs) };
        return;
    }
    for j in jobs.iter_mut() {
        for slice in &j.slices {
            compress(j.state, slice);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x16 {
    use std::arch::x86_64::*;

    use super::transpose16::transpose;
    use super::{Job, BLOCK_BYTES, K};

    const LANES: usize = 16;

    /// vpternlogd's tables for the round functions of (b, c, d): bit
    /// (b<<2 | c<<1 | d) of each is the function's value there (checked by
    /// `ternary_tables_are_the_round_functions`).
    pub(super) const F: i32 = 0xCA; // (b & c) | (!b & d)
    pub(super) const G: i32 = 0xE4; // (d & b) | (!d & c)
    pub(super) const H: i32 = 0x96; // b ^ c ^ d
    pub(super) const I: i32 = 0x39; // c ^ (b | !d)

    /// Runs the jobs through 16 lanes: each lane takes the next job when
    /// its own is done; lanes without a job hash a zero block in place
    /// (their result is discarded).
    ///
    /// # Safety
    /// The CPU must have AVX-512F, and every job's `blocks` must be whole
    /// blocks.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn run(jobs: &mut [Job<'_>]) {
        let zero = [0u8; BLOCK_BYTES];
        // Per lane: (job, slice, byte offset in the slice), or idle.
        let mut at: [Option<(usize, usize, usize)>; LANES] = [None; LANES];
        let mut st = [[0u32; LANES]; 4];
        let mut next = 0;
        loop {
            // Idle lanes take the next jobs; a lane at the end of a slice
            // moves to the job's next one (its state stays in the lane)
            // or, at the job's end, hands the state back and goes idle.
            for lane in 0..LANES {
                if let Some((j, mut k, off)) = at[lane] {
                    if off < jobs[j].slices[k].len() {
                        continue;
                    }
                    k += 1;
                    while k < jobs[j].slices.len() && jobs[j].slices[k].is_empty() {
                        k += 1;
                    }
                    if k < jobs[j].slices.len() {
                        at[lane] = Some((j, k, 0));
                        continue;
                    }
                    for (r, s) in st.iter().enumerate() {
                        jobs[j].state[r] = s[lane];
                    }
                    at[lane] = None;
                }
                while next < jobs.len() {
                    let j = next;
                    next += 1;
                    if let Some(k) = jobs[j].slices.iter().position(|s| !s.is_empty()) {
                        at[lane] = Some((j, k, 0));
                        for (r, s) in st.iter_mut().enumerate() {
                            s[lane] = jobs[j].state[r];
                        }
                        break;
                    }
                }
            }
            let mut steps = usize::MAX;
            let mut addr = [zero.as_ptr() as u64; LANES];
            let mut stride = [0u64; LANES];
            for lane in 0..LANES {
                if let Some((j, k, off)) = at[lane] {
                    let slice = jobs[j].slices[k];
                    steps = steps.min((slice.len() - off) / BLOCK_BYTES);
                    addr[lane] = slice.as_ptr().add(off) as u64;
                    stride[lane] = BLOCK_BYTES as u64;
                }
            }
            if steps == usize::MAX {
                return; // every lane idle: all jobs done
            }
            // SAFETY: each active lane's address walks `steps` whole blocks
            // inside its current slice; idle lanes stay on `zero`.
            unsafe { blocks(&mut st, &addr, &stride, steps) };
            for a in at.iter_mut().flatten() {
                a.2 += steps * BLOCK_BYTES;
            }
        }
    }

    /// `steps` blocks of every lane: lane i reads 64 bytes at `addr[i]`,
    /// then moves on by `stride[i]`.
    ///
    /// # Safety
    /// AVX-512F; every lane's `steps` blocks must be readable.
    #[target_feature(enable = "avx512f")]
    unsafe fn blocks(
        st: &mut [[u32; LANES]; 4],
        addr: &[u64; LANES],
        stride: &[u64; LANES],
        steps: usize,
    ) {
        // SAFETY (all loads and stores below): arrays of 16 u32 / 8 u64
        // are exactly one 512-bit vector; unaligned loads and stores.
        let mut a = _mm512_loadu_si512(st[0].as_ptr().cast());
        let mut b = _mm512_loadu_si512(st[1].as_ptr().cast());
        let mut c = _mm512_loadu_si512(st[2].as_ptr().cast());
        let mut d = _mm512_loadu_si512(st[3].as_ptr().cast());
        let mut ptr = *addr;
        for _ in 0..steps {
            // Lane i's block is row i of a 16x16 matrix of words; m[w] is
            // column w (word w of every lane): a 4-stage transpose.
            let mut r = [_mm512_setzero_si512(); 16];
            for (lane, row) in r.iter_mut().enumerate() {
                // SAFETY: the caller guarantees 64 readable bytes here.
                *row = _mm512_loadu_si512((ptr[lane] as *const u8).cast());
            }
            let m = transpose(r);
            let (aa, bb, cc, dd) = (a, b, c, d);
            macro_rules! step {
                ($imm:expr, $a:ident, $b:ident, $c:ident, $d:ident, $w:expr, $s:expr, $i:expr) => {{
                    let f = _mm512_ternarylogic_epi32::<$imm>($b, $c, $d);
                    let t = _mm512_add_epi32(
                        _mm512_add_epi32($a, f),
                        _mm512_add_epi32(_mm512_set1_epi32(K[$i] as i32), m[$w]),
                    );
                    $a = _mm512_add_epi32($b, _mm512_rol_epi32::<$s>(t));
                }};
            }
            md5_steps!(step, a, b, c, d);
            a = _mm512_add_epi32(a, aa);
            b = _mm512_add_epi32(b, bb);
            c = _mm512_add_epi32(c, cc);
            d = _mm512_add_epi32(d, dd);
            for (p, step) in ptr.iter_mut().zip(stride) {
                *p += step;
            }
        }
        _mm512_storeu_si512(st[0].as_mut_ptr().cast(), a);
        _mm512_storeu_si512(st[1].as_mut_ptr().cast(), b);
        _mm512_storeu_si512(st[2].as_mut_ptr().cast(), c);
        _mm512_storeu_si512(st[3].as_mut_ptr().cast(), d);
    }
}

#[cfg(target_arch = "x86_64")]
mod transpose16 {
    use std::arch::x86_64::*;

    /// Transposes a 16x16 matrix of 32-bit words held one row per vector.
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) unsafe fn transpose(r: [__m512i; 16]) -> [__m512i; 16] {
        let mut t = [_mm512_setzero_si512(); 16];
        // 32-bit interleave of row pairs.
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        // 64-bit interleave within groups of four rows.
        let mut u = [_mm512_setzero_si512(); 16];
        for g in 0..4 {
            let b = 4 * g;
            u[b] = _mm512_unpacklo_epi64(t[b], t[b + 2]);
            u[b + 1] = _mm512_unpackhi_epi64(t[b], t[b + 2]);
            u[b + 2] = _mm512_unpacklo_epi64(t[b + 1], t[b + 3]);
            u[b + 3] = _mm512_unpackhi_epi64(t[b + 1], t[b + 3]);
        }
        // 128-bit lanes: pairs of groups (0,1) and (2,3).
        for h in 0..2 {
            let b = 8 * h;
            for k in 0..4 {
                t[b + k] = _mm512_shuffle_i32x4::<0x88>(u[b + k], u[b + 4 + k]);
                t[b + 4 + k] = _mm512_shuffle_i32x4::<0xdd>(u[b + k], u[b + 4 + k]);
            }
        }
        // 128-bit lanes across the halves.
        let mut out = [_mm512_setzero_si512(); 16];
        for k in 0..8 {
            out[k] = _mm512_shuffle_i32x4::<0x88>(t[k], t[8 + k]);
            out[8 + k] = _mm512_shuffle_i32x4::<0xdd>(t[k], t[8 + k]);
        }
        out
    }
}

/// An incremental MD5: bytes in any pieces, whole blocks hashed here
/// (`update`) or taken out for lanes (`take_blocks` / `blocks_done`).
#[derive(Clone)]
pub struct Md5Stream {
    state: [u32; 4],
    /// Bytes hashed into `state` (whole blocks).
    hashed_bytes: u64,
    /// Bytes after the last whole block.
    tail: [u8; BLOCK_BYTES],
    tail_bytes: usize,
}

impl Default for Md5Stream {
    fn default() -> Self {
        Md5Stream::new()
    }
}

impl Md5Stream {
    pub fn new() -> Md5Stream {
        Md5Stream {
            state: INIT,
            hashed_bytes: 0,
            tail: [0; BLOCK_BYTES],
            tail_bytes: 0,
        }
    }

    /// Adds `data` (scalar).
    pub fn update(&mut self, data: &[u8]) {
        let whole = self.split(data);
        compress(&mut self.state, whole);
        self.hashed_bytes += whole.len() as u64;
    }

    /// Adds `data`: completes the stream's tail block from its front, keeps
    /// the bytes after its last whole block as the new tail, and returns
    /// the whole blocks in between (a sub-slice of `data`) for the caller
    /// to hash into `state_mut()`, then report with `blocks_done`.
    pub fn split<'a>(&mut self, data: &'a [u8]) -> &'a [u8] {
        let (completed, whole) = self.split_deferred(data);
        if let Some(block) = completed {
            compress(&mut self.state, &block);
            self.hashed_bytes += BLOCK_BYTES as u64;
        }
        whole
    }

    /// Like `split`, for a stream whose state may lag behind (its earlier
    /// blocks still queued for hashing): a tail block completed by `data`
    /// is returned rather than hashed, to be hashed before the whole blocks.
    pub fn split_deferred<'a>(
        &mut self,
        mut data: &'a [u8],
    ) -> (Option<[u8; BLOCK_BYTES]>, &'a [u8]) {
        let mut completed = None;
        if self.tail_bytes > 0 {
            let take = (BLOCK_BYTES - self.tail_bytes).min(data.len());
            self.tail[self.tail_bytes..self.tail_bytes + take].copy_from_slice(&data[..take]);
            self.tail_bytes += take;
            data = &data[take..];
            if self.tail_bytes < BLOCK_BYTES {
                return (None, &[]);
            }
            completed = Some(self.tail);
            self.tail_bytes = 0;
        }
        let (whole, rest) = data.split_at(data.len() - data.len() % BLOCK_BYTES);
        self.tail[..rest.len()].copy_from_slice(rest);
        self.tail_bytes = rest.len();
        (completed, whole)
    }

    /// The state for hashing blocks `split` returned.
    pub fn state_mut(&mut self) -> &mut [u32; 4] {
        &mut self.state
    }

    /// `bytes` of blocks `split` returned were hashed into the state.
    pub fn blocks_done(&mut self, bytes: usize) {
        self.hashed_bytes += bytes as u64;
    }

    /// The digest.
    pub fn finish(mut self) -> [u8; 16] {
        let total_bits = (self.hashed_bytes + self.tail_bytes as u64).wrapping_mul(8);
        let mut last = [0u8; 2 * BLOCK_BYTES];
        last[..self.tail_bytes].copy_from_slice(&self.tail[..self.tail_bytes]);
        last[self.tail_bytes] = 0x80;
        let end = if self.tail_bytes < BLOCK_BYTES - 8 {
            BLOCK_BYTES
        } else {
            2 * BLOCK_BYTES
        };
        last[end - 8..end].copy_from_slice(&total_bits.to_le_bytes());
        compress(&mut self.state, &last[..end]);
        let mut out = [0u8; 16];
        for (o, s) in out.chunks_exact_mut(4).zip(self.state) {
            o.copy_from_slice(&s.to_le_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests;
