//! Additional checksums (x-amz-checksum-*): CRC32, CRC32C, CRC64NVME, SHA1,
//! SHA256. Verified on upload whether sent as a header or an aws-chunked
//! trailer, stored with the object, returned by GET/HEAD in checksum mode.

use crate::frontend::http::RequestHead;
use crate::frontend::s3::error::S3Error;
pub use crate::store::checksum::{Algorithm, ChecksumType, Hasher, UploadChecksum, HEADER_PREFIX};

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
