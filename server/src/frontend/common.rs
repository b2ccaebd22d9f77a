//! What both front doors (S3 over HTTP and the native protocol) share: the
//! key pair they accept, the loopback rule for the built-in default
//! credentials, bucket-name validation and the object size limits.

use glommio::net::TcpStream;

/// S3's key length limit (bytes of UTF-8).
pub const S3_KEY_BYTES_MAX: usize = 1024;
/// S3's single-PUT limit, also the native protocol's largest object.
pub const PUT_BYTES_MAX: u64 = 5 << 30;

/// The one access key / secret key pair the server accepts.
#[derive(Clone)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
    /// The built-in defaults: accepted from loopback peers only.
    pub is_default: bool,
}

impl Credentials {
    /// Whether these credentials may be used by a peer that is (or is not)
    /// on loopback: the built-in defaults are known to everyone, so they
    /// are good only from the same machine.
    pub fn allowed_from(&self, loopback: bool) -> bool {
        !self.is_default || loopback
    }
}

/// Whether the connection's peer is a loopback address (false when the
/// address cannot be read: the strict answer).
pub fn peer_is_loopback(stream: &TcpStream) -> bool {
    stream
        .peer_addr()
        .map(|a| a.ip().is_loopback())
        .unwrap_or(false)
}

/// S3 bucket naming rules (the strict, DNS-compatible ones).
pub fn valid_bucket_name(name: &str) -> bool {
    let b = name.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'.' || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !name.contains("..")
        && name.parse::<std::net::Ipv4Addr>().is_err()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_credentials_only_from_loopback() {
        let mut c = Credentials {
            access_key: "a".into(),
            secret_key: "s".into(),
            is_default: true,
        };
        assert!(c.allowed_from(true));
        assert!(!c.allowed_from(false));
        c.is_default = false;
        assert!(c.allowed_from(true));
        assert!(c.allowed_from(false));
    }

    #[test]
    fn bucket_names() {
        for ok in ["abc", "a-b.c", "0bucket", &"a".repeat(63)] {
            assert!(valid_bucket_name(ok), "{ok}");
        }
        for bad in [
            "ab",
            &"a".repeat(64),
            "Abc",
            "-abc",
            "abc-",
            "a..b",
            "192.168.1.1",
            "a_b",
        ] {
            assert!(!valid_bucket_name(bad), "{bad}");
        }
    }
}
