//! S3 errors: one type, mapped once to status, code and XML.

use crate::frontend::http::HttpError;
use crate::frontend::s3::auth::AuthError;
use crate::shard::msg::ShardError;
use crate::store::mpu::UploadError;

#[derive(Debug, Clone)]
pub struct S3Error {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl S3Error {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> S3Error {
        S3Error {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn no_such_bucket() -> S3Error {
        S3Error::new(404, "NoSuchBucket", "The specified bucket does not exist")
    }

    pub fn no_such_key() -> S3Error {
        S3Error::new(404, "NoSuchKey", "The specified key does not exist.")
    }

    pub fn no_such_version() -> S3Error {
        S3Error::new(
            404,
            "NoSuchVersion",
            "The specified version does not exist.",
        )
    }

    pub fn invalid_argument(message: impl Into<String>) -> S3Error {
        S3Error::new(400, "InvalidArgument", message)
    }

    pub fn not_implemented(what: &str) -> S3Error {
        S3Error::new(
            501,
            "NotImplemented",
            format!("{what} is not implemented by percore yet"),
        )
    }

    pub fn internal(message: impl Into<String>) -> S3Error {
        S3Error::new(500, "InternalError", message)
    }
}

impl From<ShardError> for S3Error {
    fn from(e: ShardError) -> S3Error {
        match e {
            ShardError::NoSuchKey => S3Error::no_such_key(),
            ShardError::NoSuchVersion => S3Error::no_such_version(),
            // With its headers where it is read (`S3Front::versioned`).
            ShardError::DeleteMarker { named: false, .. } => S3Error::no_such_key(),
            ShardError::DeleteMarker { named: true, .. } => S3Error::new(
                405,
                "MethodNotAllowed",
                "The specified method is not allowed against this resource: the version is a delete marker.",
            ),
            ShardError::NotImplemented(m) => S3Error::not_implemented(&m),
            ShardError::NoSuchBucket => S3Error::no_such_bucket(),
            ShardError::BucketNotEmpty => {
                S3Error::new(409, "BucketNotEmpty", "The bucket you tried to delete is not empty")
            }
            ShardError::Busy => S3Error::new(503, "SlowDown", "Please reduce your request rate."),
            ShardError::BucketClosing => S3Error::new(
                503,
                "SlowDown",
                "The bucket is being deleted (DeleteBucket checks that it is empty); retry.",
            ),
            ShardError::NoSpace(m) => S3Error::new(
                507,
                "InsufficientStorage",
                format!("The server is out of disk space ({m}); free space or add capacity, then retry."),
            ),
            ShardError::Corrupt(m) => {
                S3Error::internal(format!("Stored data failed its checksum and was not served: {m}"))
            }
            ShardError::Internal(m) => S3Error::internal(m),
            ShardError::ShuttingDown => S3Error::new(503, "ServiceUnavailable", "The server is shutting down."),
            ShardError::PreconditionFailed => S3Error::new(
                412,
                "PreconditionFailed",
                "At least one of the pre-conditions you specified did not hold",
            ),
            ShardError::ConditionalConflict => S3Error::new(
                409,
                "ConditionalRequestConflict",
                "A conflicting operation occurred on this key. Retry the request.",
            ),
            ShardError::Upload(e) => {
                let message = e.to_string();
                match e {
                    UploadError::NoSuchUpload => S3Error::new(404, "NoSuchUpload", "The specified multipart upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed."),
                    UploadError::InvalidPart(_) => S3Error::new(400, "InvalidPart", format!("One or more of the specified parts could not be found: {message}. Upload the part again or list the parts for their ETags.")),
                    UploadError::InvalidPartOrder => S3Error::new(400, "InvalidPartOrder", "The list of parts was not in ascending order. Parts must be ordered by part number."),
                    UploadError::EntityTooSmall(_) => S3Error::new(400, "EntityTooSmall", format!("Your proposed upload is smaller than the minimum allowed object size: {message}.")),
                    UploadError::TooManyExtents(_) => S3Error::new(400, "EntityTooLarge", format!("Your proposed upload exceeds the maximum allowed object size: {message}.")),
                    UploadError::NoParts => S3Error::new(400, "MalformedXML", "The XML you provided was not well-formed or did not validate against our published schema: it lists no parts."),
                    UploadError::PartChecksum(_) => S3Error::new(400, "InvalidPart", format!("One or more of the specified parts could not be found: {message}. List the parts for their checksums.")),
                    UploadError::ObjectChecksum(_) => S3Error::new(400, "BadDigest", format!("{message}.")),
                    UploadError::ChecksumChoice(_)
                    | UploadError::ChecksumAlgorithm { .. }
                    | UploadError::ChecksumType { .. }
                    | UploadError::PartChecksumMissing(_)
                    | UploadError::ObjectSize { .. } => S3Error::new(400, "InvalidRequest", format!("{message}.")),
                }
            }
        }
    }
}

impl From<AuthError> for S3Error {
    fn from(e: AuthError) -> S3Error {
        S3Error {
            status: e.http_status(),
            code: e.s3_code(),
            message: e.message(),
        }
    }
}

impl From<HttpError> for S3Error {
    fn from(e: HttpError) -> S3Error {
        let code = match e.status() {
            408 => "RequestTimeout",
            413 => "EntityTooLarge",
            431 => "RequestHeaderSectionTooLarge",
            501 => "NotImplemented",
            505 => "HttpVersionNotSupported",
            _ => "BadRequest",
        };
        S3Error::new(e.status(), code, e.to_string())
    }
}

impl From<crate::bucket_config::ConfigError> for S3Error {
    fn from(e: crate::bucket_config::ConfigError) -> S3Error {
        S3Error::new(e.status, e.code, e.message)
    }
}
