//! Additional checksums (x-amz-checksum-*): CRC32, CRC32C, CRC64NVME, SHA1,
//! SHA256. Verified on upload whether sent as a header or an aws-chunked
//! trailer, stored with the object, returned by GET/HEAD in checksum mode.

use base64::Engine as _;
use crc::{Crc, Table, CRC_64_NVME};
use sha1::Sha1;
use sha2::{Digest, Sha256};

use crate::frontend::http::RequestHead;
use crate::frontend::s3::error::S3Error;

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

    fn digest_bytes(self) -> usize {
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
        let bytes: Vec<u8> = match self.state {
            State::Crc32(h) => h.finalize().to_be_bytes().to_vec(),
            State::Crc32c(c) => c.to_be_bytes().to_vec(),
            State::Crc64(d) => d.finalize().to_be_bytes().to_vec(),
            State::Sha1(h) => h.finalize().to_vec(),
            State::Sha256(h) => h.finalize().to_vec(),
        };
        debug_assert_eq!(bytes.len(), self.algorithm.digest_bytes());
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }
}

/// What a request asks to be verified.
pub struct Expected {
    pub algorithm: Algorithm,
    /// From the header; None when it comes as a trailer (or is not sent).
    pub value: Option<String>,
}

fn invalid(message: impl Into<String>) -> S3Error {
    S3Error::new(400, "InvalidRequest", message)
}

/// Reads x-amz-checksum-*, x-amz-sdk-checksum-algorithm and x-amz-trailer.
pub fn expected(head: &RequestHead) -> Result<Option<Expected>, S3Error> {
    let mut found: Option<Expected> = None;
    for a in Algorithm::ALL {
        if let Some(v) = head.header_str(a.header()) {
            if found.is_some() {
                return Err(invalid("Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed."));
            }
            found = Some(Expected {
                algorithm: a,
                value: Some(v.trim().to_string()),
            });
        }
    }
    if let Some(trailer) = head.header_str("x-amz-trailer") {
        for name in trailer.split(',').map(str::trim) {
            let Some(a) = Algorithm::ALL
                .into_iter()
                .find(|a| a.header().eq_ignore_ascii_case(name))
            else {
                return Err(invalid(format!(
                    "The trailer {name} is not supported; send an x-amz-checksum-* trailer."
                )));
            };
            if found
                .as_ref()
                .is_some_and(|f| f.algorithm != a || f.value.is_some())
            {
                return Err(invalid("Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed."));
            }
            found = Some(Expected {
                algorithm: a,
                value: None,
            });
        }
    }
    if let Some(name) = head.header_str("x-amz-sdk-checksum-algorithm") {
        let a = Algorithm::from_name(name.trim()).ok_or_else(|| {
            invalid(format!(
                "Value for x-amz-sdk-checksum-algorithm header is invalid: {name}"
            ))
        })?;
        match &found {
            Some(f) if f.algorithm != a => {
                return Err(invalid(
                    "x-amz-sdk-checksum-algorithm names another algorithm than the checksum sent",
                ));
            }
            Some(_) => {}
            None => {
                found = Some(Expected {
                    algorithm: a,
                    value: None,
                })
            }
        }
    }
    Ok(found)
}

/// The error S3 returns when a checksum does not match.
pub fn mismatch(algorithm: Algorithm) -> S3Error {
    S3Error::new(
        400,
        "BadDigest",
        format!(
            "The {} you specified did not match the calculated checksum.",
            algorithm.name()
        ),
    )
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
}
