//! Object checksums (S3's x-amz-checksum-*): CRC32, CRC32C, CRC64NVME,
//! SHA1, SHA256; and the checksums of multipart objects, computed from
//! their parts' at completion without reading a byte:
//!
//! - COMPOSITE: the algorithm's digest of the parts' digests (raw,
//!   big-endian, in order), shown as `base64-N` for N parts (any algorithm);
//! - FULL_OBJECT: the CRC of the whole object, combined from the parts'
//!   CRCs and lengths (CRCs only). All three CRCs are reflected, with every
//!   bit set in both the initial value and the final XOR, so zlib's
//!   `crc32_combine` works on their finished values:
//!   `crc(A ++ B) = crc(A) * x^(8 * len(B)) mod P  xor  crc(B)`.
//!
//! A multipart upload's choice ([`UploadChecksum`]) is kept as the ETag of
//! its upload record (the index holds it; no read needed per part), which
//! is otherwise empty and never shown.

use base64::Engine as _;
use crc::{Crc, Table, CRC_64_NVME};
use sha1::Sha1;
use sha2::{Digest, Sha256};

static CRC64_NVME: Crc<u64, Table<16>> = Crc::<u64, Table<16>>::new(&CRC_64_NVME);

/// Stored header names start with this.
pub const HEADER_PREFIX: &str = "x-amz-checksum-";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
}

impl Algorithm {
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Crc32,
        Algorithm::Crc32c,
        Algorithm::Crc64Nvme,
        Algorithm::Sha1,
        Algorithm::Sha256,
    ];

    pub fn from_name(name: &str) -> Option<Algorithm> {
        Self::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(name))
    }

    /// As S3 spells it in x-amz-sdk-checksum-algorithm.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "CRC32",
            Algorithm::Crc32c => "CRC32C",
            Algorithm::Crc64Nvme => "CRC64NVME",
            Algorithm::Sha1 => "SHA1",
            Algorithm::Sha256 => "SHA256",
        }
    }

    pub fn header(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "x-amz-checksum-crc32",
            Algorithm::Crc32c => "x-amz-checksum-crc32c",
            Algorithm::Crc64Nvme => "x-amz-checksum-crc64nvme",
            Algorithm::Sha1 => "x-amz-checksum-sha1",
            Algorithm::Sha256 => "x-amz-checksum-sha256",
        }
    }

    pub fn digest_bytes(self) -> usize {
        match self {
            Algorithm::Crc32 | Algorithm::Crc32c => 4,
            Algorithm::Crc64Nvme => 8,
            Algorithm::Sha1 => 20,
            Algorithm::Sha256 => 32,
        }
    }
}

enum State {
    Crc32(crc32fast::Hasher),
    Crc32c(u32),
    Crc64(crc::Digest<'static, u64, Table<16>>),
    Sha1(Sha1),
    Sha256(Sha256),
}

pub struct Hasher {
    algorithm: Algorithm,
    state: State,
}

impl Hasher {
    pub fn new(algorithm: Algorithm) -> Hasher {
        let state = match algorithm {
            Algorithm::Crc32 => State::Crc32(crc32fast::Hasher::new()),
            Algorithm::Crc32c => State::Crc32c(0),
            Algorithm::Crc64Nvme => State::Crc64(CRC64_NVME.digest()),
            Algorithm::Sha1 => State::Sha1(Sha1::new()),
            Algorithm::Sha256 => State::Sha256(Sha256::new()),
        };
        Hasher { algorithm, state }
    }

    pub fn update(&mut self, data: &[u8]) {
        match &mut self.state {
            State::Crc32(h) => h.update(data),
            State::Crc32c(c) => *c = crc32c::crc32c_append(*c, data),
            State::Crc64(d) => d.update(data),
            State::Sha1(h) => h.update(data),
            State::Sha256(h) => h.update(data),
        }
    }

    /// Base64 of the big-endian digest, as S3 sends it.
    pub fn finish_base64(self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.finish_raw())
    }

    /// The digest, big-endian.
    pub fn finish_raw(self) -> Vec<u8> {
        let bytes: Vec<u8> = match self.state {
            State::Crc32(h) => h.finalize().to_be_bytes().to_vec(),
            State::Crc32c(c) => c.to_be_bytes().to_vec(),
            State::Crc64(d) => d.finalize().to_be_bytes().to_vec(),
            State::Sha1(h) => h.finalize().to_vec(),
            State::Sha256(h) => h.finalize().to_vec(),
        };
        debug_assert_eq!(bytes.len(), self.algorithm.digest_bytes());
        bytes
    }
}

/// How a multipart object's checksum covers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumType {
    Composite,
    FullObject,
}

impl ChecksumType {
    pub fn name(self) -> &'static str {
        match self {
            ChecksumType::Composite => "COMPOSITE",
            ChecksumType::FullObject => "FULL_OBJECT",
        }
    }

    pub fn from_name(name: &str) -> Option<ChecksumType> {
        [ChecksumType::Composite, ChecksumType::FullObject]
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// The type of a stored checksum value: composite ones end in `-N`
    /// (base64 has no dash).
    pub fn of_value(value: &str) -> ChecksumType {
        if value.contains('-') {
            ChecksumType::Composite
        } else {
            ChecksumType::FullObject
        }
    }
}

/// The checksum a multipart upload was created with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadChecksum {
    pub algorithm: Algorithm,
    pub kind: ChecksumType,
}

impl UploadChecksum {
    /// `algorithm` with `kind`, or S3's default for it (FULL_OBJECT for
    /// CRC64NVME, COMPOSITE for the others). SHA digests cannot be
    /// combined (no FULL_OBJECT) and CRC64NVME is FULL_OBJECT only.
    pub fn new(algorithm: Algorithm, kind: Option<ChecksumType>) -> Result<UploadChecksum, String> {
        let kind = kind.unwrap_or(match algorithm {
            Algorithm::Crc64Nvme => ChecksumType::FullObject,
            _ => ChecksumType::Composite,
        });
        let allowed = match kind {
            ChecksumType::FullObject => algorithm.is_crc(),
            ChecksumType::Composite => algorithm != Algorithm::Crc64Nvme,
        };
        if !allowed {
            return Err(format!(
                "The {} checksum type is not supported with the {} algorithm",
                kind.name(),
                algorithm.name()
            ));
        }
        Ok(UploadChecksum { algorithm, kind })
    }

    /// As kept in the upload record: `CRC32/COMPOSITE`.
    pub fn encode(self) -> String {
        format!("{}/{}", self.algorithm.name(), self.kind.name())
    }

    /// An upload record's ETag; None for an upload without a checksum.
    pub fn decode(stored: &str) -> Option<UploadChecksum> {
        let (a, k) = stored.split_once('/')?;
        UploadChecksum::new(Algorithm::from_name(a)?, Some(ChecksumType::from_name(k)?)).ok()
    }

    /// The completed object's checksum value from its parts' raw digests
    /// and lengths, in order.
    pub fn complete(self, parts: &[(Vec<u8>, u64)]) -> String {
        let b64 = |raw: &[u8]| base64::engine::general_purpose::STANDARD.encode(raw);
        match self.kind {
            ChecksumType::Composite => {
                let mut h = Hasher::new(self.algorithm);
                for (raw, _) in parts {
                    h.update(raw);
                }
                format!("{}-{}", h.finish_base64(), parts.len())
            }
            ChecksumType::FullObject => {
                let crc = Reflected::of(self.algorithm).expect("FULL_OBJECT is for CRCs");
                let mut whole = crc.empty();
                // Parts are nearly all of one size: x^(8 len) once per size.
                let mut shift: Option<(u64, u64)> = None;
                for (raw, len) in parts {
                    let by = match shift {
                        Some((l, s)) if l == *len => s,
                        _ => {
                            let s = crc.shift(*len);
                            shift = Some((*len, s));
                            s
                        }
                    };
                    whole = crc.multiply(by, whole) ^ be_value(raw);
                }
                b64(&crc.be_bytes(whole))
            }
        }
    }
}

impl Algorithm {
    pub fn is_crc(self) -> bool {
        matches!(
            self,
            Algorithm::Crc32 | Algorithm::Crc32c | Algorithm::Crc64Nvme
        )
    }

    /// The raw digest in a base64 value of this algorithm; None if it is
    /// not base64 or not this algorithm's length.
    pub fn decode(self, value: &str) -> Option<Vec<u8>> {
        base64::engine::general_purpose::STANDARD
            .decode(value.trim())
            .ok()
            .filter(|raw| raw.len() == self.digest_bytes())
    }
}

/// A big-endian digest's value.
fn be_value(raw: &[u8]) -> u64 {
    raw.iter().fold(0u64, |v, &byte| (v << 8) | u64::from(byte))
}

/// A reflected CRC whose initial value and final XOR are all ones (CRC32,
/// CRC32C, CRC64NVME), for combining finished values.
struct Reflected {
    /// The reflected polynomial.
    poly: u64,
    width: u32,
}

impl Reflected {
    fn of(algorithm: Algorithm) -> Option<Reflected> {
        let (poly, width) = match algorithm {
            Algorithm::Crc32 => (0xEDB8_8320, 32),
            Algorithm::Crc32c => (0x82F6_3B78, 32),
            Algorithm::Crc64Nvme => (0x9A6C_9329_AC4B_C9B5, 64),
            Algorithm::Sha1 | Algorithm::Sha256 => return None,
        };
        Some(Reflected { poly, width })
    }

    /// The CRC of no bytes.
    fn empty(&self) -> u64 {
        0
    }

    /// x^0 (the polynomial 1) in the reflected representation.
    fn one(&self) -> u64 {
        1 << (self.width - 1)
    }

    /// a * b mod P.
    fn multiply(&self, a: u64, mut b: u64) -> u64 {
        let mut product = 0;
        let mut m = self.one();
        for _ in 0..self.width {
            if a & m != 0 {
                product ^= b;
            }
            m >>= 1;
            b = if b & 1 != 0 {
                (b >> 1) ^ self.poly
            } else {
                b >> 1
            };
        }
        product
    }

    /// x^(8 * bytes) mod P: `crc(A ++ B) = shift(len(B)) * crc(A) ^ crc(B)`.
    fn shift(&self, bytes: u64) -> u64 {
        let mut result = self.one();
        let mut base = self.one() >> 8; // x^8
        let mut n = bytes;
        while n > 0 {
            if n & 1 != 0 {
                result = self.multiply(result, base);
            }
            base = self.multiply(base, base);
            n >>= 1;
        }
        result
    }

    fn be_bytes(&self, v: u64) -> Vec<u8> {
        let bytes = (self.width / 8) as usize;
        v.to_be_bytes()[8 - bytes..].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(a: Algorithm, data: &[u8]) -> String {
        let mut h = Hasher::new(a);
        for piece in data.chunks(7) {
            h.update(piece);
        }
        h.finish_base64()
    }

    #[test]
    fn known_values() {
        // "123456789" check values of each CRC, big-endian, base64.
        let check = |v: &[u8]| base64::engine::general_purpose::STANDARD.encode(v);
        assert_eq!(
            b64(Algorithm::Crc32, b"123456789"),
            check(&0xCBF43926u32.to_be_bytes())
        );
        assert_eq!(
            b64(Algorithm::Crc32c, b"123456789"),
            check(&0xE3069283u32.to_be_bytes())
        );
        assert_eq!(
            b64(Algorithm::Crc64Nvme, b"123456789"),
            check(&0xAE8B14860A799888u64.to_be_bytes())
        );
        // SHA-256 of the empty string.
        assert_eq!(
            b64(Algorithm::Sha256, b""),
            "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
        );
        assert_eq!(b64(Algorithm::Sha1, b""), "2jmj7l5rSw0yVb/vlWAYkK/YBwk=");
    }

    fn raw(a: Algorithm, data: &[u8]) -> Vec<u8> {
        let mut h = Hasher::new(a);
        h.update(data);
        h.finish_raw()
    }

    /// FULL_OBJECT values combined from parts equal the CRC of the whole,
    /// for every CRC, over random splits (empty parts included).
    #[test]
    fn full_object_combines_to_the_whole_crc() {
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let data: Vec<u8> = (0..70_000).map(|_| next() as u8).collect();
        for a in [Algorithm::Crc32, Algorithm::Crc32c, Algorithm::Crc64Nvme] {
            let spec = UploadChecksum::new(a, Some(ChecksumType::FullObject)).unwrap();
            for _ in 0..40 {
                let mut cuts: Vec<usize> = (0..(next() % 6))
                    .map(|_| (next() % 70_001) as usize)
                    .collect();
                cuts.push(0);
                cuts.push(data.len());
                cuts.sort_unstable();
                let parts: Vec<(Vec<u8>, u64)> = cuts
                    .windows(2)
                    .map(|w| (raw(a, &data[w[0]..w[1]]), (w[1] - w[0]) as u64))
                    .collect();
                assert_eq!(spec.complete(&parts), b64(a, &data), "{a:?} {cuts:?}");
            }
        }
    }

    #[test]
    fn composite_is_the_digest_of_the_part_digests() {
        for a in Algorithm::ALL
            .into_iter()
            .filter(|a| *a != Algorithm::Crc64Nvme)
        {
            let spec = UploadChecksum::new(a, None).unwrap();
            assert_eq!(spec.kind, ChecksumType::Composite);
            let parts = vec![(raw(a, b"abc"), 3), (raw(a, b"defg"), 4)];
            let mut joined = raw(a, b"abc");
            joined.extend(raw(a, b"defg"));
            let want = format!("{}-2", b64(a, &joined));
            assert_eq!(spec.complete(&parts), want);
            assert_eq!(ChecksumType::of_value(&want), ChecksumType::Composite);
        }
        assert_eq!(
            ChecksumType::of_value(&b64(Algorithm::Crc32, b"x")),
            ChecksumType::FullObject
        );
    }

    #[test]
    fn upload_choices() {
        use ChecksumType::*;
        assert_eq!(
            UploadChecksum::new(Algorithm::Crc64Nvme, None)
                .unwrap()
                .kind,
            FullObject
        );
        assert!(UploadChecksum::new(Algorithm::Crc64Nvme, Some(Composite)).is_err());
        assert!(UploadChecksum::new(Algorithm::Sha256, Some(FullObject)).is_err());
        assert!(UploadChecksum::new(Algorithm::Sha1, Some(FullObject)).is_err());
        for a in Algorithm::ALL {
            for k in [Composite, FullObject] {
                if let Ok(c) = UploadChecksum::new(a, Some(k)) {
                    assert_eq!(UploadChecksum::decode(&c.encode()), Some(c));
                }
            }
        }
        for bad in ["", "CRC32", "CRC32/", "MD5/COMPOSITE", "SHA256/FULL_OBJECT"] {
            assert_eq!(UploadChecksum::decode(bad), None, "{bad}");
        }
        assert_eq!(Algorithm::Crc32.decode("AAAAAA=="), Some(vec![0; 4]));
        assert_eq!(Algorithm::Crc32.decode("AAAAAAAA"), None);
        assert_eq!(Algorithm::Crc32.decode("!!"), None);
    }
}
