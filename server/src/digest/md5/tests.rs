use md5::Digest as _;

use super::*;

/// xorshift64*: reproducible test bytes and lengths.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

fn reference(data: &[u8]) -> [u8; 16] {
    ::md5::Md5::digest(data).into()
}

#[test]
fn known_answers_from_rfc_1321() {
    let cases: [(&str, &str); 4] = [
        ("", "d41d8cd98f00b204e9800998ecf8427e"),
        ("abc", "900150983cd24fb0d6963f7d28e17f72"),
        ("message digest", "f96b697d7cb7938d525a2f31aaf161d0"),
        (
            "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
            "57edf4a22be3c955ac49da2e2107b67a",
        ),
    ];
    for (input, want) in cases {
        let mut s = Md5Stream::new();
        s.update(input.as_bytes());
        assert_eq!(hex::encode(s.finish()), want, "md5({input:?})");
    }
}

#[test]
fn the_stream_matches_the_reference_for_any_split() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..300 {
        let len = match rng.below(4) {
            0 => rng.below(130) as usize,
            1 => rng.below(4096) as usize,
            _ => rng.below(200_000) as usize,
        };
        let data = rng.bytes(len);
        let mut s = Md5Stream::new();
        let mut at = 0;
        while at < len {
            let n = (rng.below(3 * BLOCK_BYTES as u64 + 7) as usize + 1).min(len - at);
            let n = if rng.below(8) == 0 { len - at } else { n };
            s.update(&data[at..at + n]);
            at += n;
        }
        assert_eq!(s.finish(), reference(&data), "length {len}");
    }
}

#[test]
fn lanes_match_the_scalar_kernel_for_any_mix_of_jobs() {
    let mut rng = Rng(42);
    for round in 0..60 {
        let n = 1 + rng.below(40) as usize;
        let data: Vec<Vec<u8>> = (0..n)
            .map(|_| {
                let blocks = match rng.below(3) {
                    0 => 0,
                    1 => rng.below(4),
                    _ => rng.below(300),
                } as usize;
                rng.bytes(blocks * BLOCK_BYTES)
            })
            .collect();
        let init: Vec<[u32; 4]> = (0..n)
            .map(|_| {
                [
                    rng.next() as u32,
                    rng.next() as u32,
                    rng.next() as u32,
                    rng.next() as u32,
                ]
            })
            .collect();
        let mut want = init.clone();
        for (s, d) in want.iter_mut().zip(&data) {
            compress(s, d);
        }
        let mut got = init.clone();
        let mut jobs: Vec<Job<'_>> = got
            .iter_mut()
            .zip(&data)
            .map(|(state, d)| {
                // Cut each job into slices of whole blocks (some empty).
                let mut slices = Vec::new();
                let mut at = 0;
                let mut cut = (state[0] as usize % 5) * BLOCK_BYTES;
                while at < d.len() {
                    let n = cut.min(d.len() - at);
                    slices.push(&d[at..at + n]);
                    at += n;
                    cut = (cut * 7 + 3 * BLOCK_BYTES) % (40 * BLOCK_BYTES);
                }
                Job { state, slices }
            })
            .collect();
        compress_many(&mut jobs);
        assert_eq!(got, want, "round {round}, {n} jobs");
    }
}

#[test]
fn split_hands_out_exactly_the_whole_blocks() {
    let mut rng = Rng(7);
    for _ in 0..200 {
        let len = rng.below(100_000) as usize;
        let data = rng.bytes(len);
        let mut s = Md5Stream::new();
        let mut at = 0;
        while at < len {
            let n = (rng.below(70_000) as usize + 1).min(len - at);
            let whole = s.split(&data[at..at + n]);
            assert_eq!(whole.len() % BLOCK_BYTES, 0);
            let blocks = whole.to_vec();
            let mut jobs = [Job {
                state: s.state_mut(),
                slices: vec![&blocks],
            }];
            compress_many(&mut jobs);
            s.blocks_done(blocks.len());
            at += n;
        }
        assert_eq!(s.finish(), reference(&data), "length {len}");
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn ternary_tables_are_the_round_functions() {
    let table = |f: fn(bool, bool, bool) -> bool| {
        (0..8).fold(0, |imm, i| {
            imm | (i32::from(f(i & 4 != 0, i & 2 != 0, i & 1 != 0)) << i)
        })
    };
    assert_eq!(x16::F, table(|b, c, d| (b && c) || (!b && d)));
    assert_eq!(x16::G, table(|b, c, d| (d && b) || (!d && c)));
    assert_eq!(x16::H, table(|b, c, d| b ^ c ^ d));
    assert_eq!(x16::I, table(|b, c, d| c ^ (b || !d)));
}
