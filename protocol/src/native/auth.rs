//! Authentication (an HMAC challenge keyed with the S3 access keys) and the
//! CRC32C the protocol carries for payloads.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

fn hmac(secret: &str, parts: &[&[u8]]) -> [u8; 32] {
    let mut m = HmacSha256::new_from_slice(secret.as_bytes()).expect("any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// What the client proves: it holds the secret of `access_key` and answers
/// this very challenge (the server nonce is fresh per connection).
pub fn client_mac(
    secret: &str,
    access_key: &str,
    server_nonce: &[u8],
    client_nonce: &[u8],
) -> [u8; 32] {
    hmac(
        secret,
        &[
            b"percore-native-v1\n",
            access_key.as_bytes(),
            b"\n",
            server_nonce,
            client_nonce,
        ],
    )
}

/// What the server proves back: it holds the same secret (mutual auth).
pub fn server_proof(secret: &str, server_nonce: &[u8], client_nonce: &[u8]) -> [u8; 32] {
    hmac(
        secret,
        &[b"percore-native-v1/server\n", client_nonce, server_nonce],
    )
}

/// Constant-time comparison of two MACs.
pub fn mac_equal(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// CRC32C (Castagnoli), the checksum of chunks and PUT bodies.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}
