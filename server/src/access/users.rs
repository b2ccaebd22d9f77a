//! Users: a name and one access key pair each, stored durably on the
//! bucket-owner shard (`store::bucket_config`, namespace of users) and
//! applied on every shard, where S3 and native authentication look keys up.

use std::collections::HashMap;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

/// The name policies use for the root principal (the server's own keys).
pub const ROOT_NAME: &str = "root";
/// User names: 1 to 64 of `[A-Za-z0-9_.@+=,-]` (IAM's characters), not
/// `root`.
pub const USER_NAME_BYTES_MAX: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub name: String,
    pub access_key: String,
    pub secret_key: String,
    pub created_ms: u64,
}

pub fn valid_user_name(name: &str) -> bool {
    (1..=USER_NAME_BYTES_MAX).contains(&name.len())
        && name != ROOT_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.@+=,-".contains(&b))
}

impl User {
    /// A new user with fresh random keys: a 20-character access key
    /// (`PC` + 18 of A-Z0-9) and a 40-character secret (base64url).
    pub fn generate(name: &str, created_ms: u64) -> User {
        use base64::Engine;
        use rand::Rng;
        const UPPER: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let mut rng = rand::thread_rng();
        let access_key: String = "PC"
            .chars()
            .chain((0..18).map(|_| UPPER[rng.gen_range(0..UPPER.len())] as char))
            .collect();
        let secret: [u8; 30] = rng.gen();
        User {
            name: name.to_string(),
            access_key,
            secret_key: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret),
            created_ms,
        }
    }

    pub fn to_doc(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a user serializes")
    }

    pub fn from_doc(doc: &[u8]) -> Option<User> {
        serde_json::from_slice(doc).ok()
    }
}

/// The users one shard knows, by access key and by name.
#[derive(Debug, Default)]
pub struct Users {
    by_key: HashMap<String, Rc<User>>,
    by_name: HashMap<String, (u64, Option<Rc<User>>)>,
}

impl Users {
    /// Applies the stored document of user `name` (None: removed) written
    /// at `seq`; an older write than the one applied is ignored.
    pub fn apply(&mut self, name: &str, seq: u64, doc: Option<&[u8]>) {
        if self.by_name.get(name).is_some_and(|(s, _)| *s >= seq) {
            return;
        }
        if let Some((_, Some(old))) = self.by_name.remove(name) {
            self.by_key.remove(&old.access_key);
        }
        let user = doc.and_then(User::from_doc).map(Rc::new);
        if let Some(u) = &user {
            self.by_key.insert(u.access_key.clone(), u.clone());
        }
        self.by_name.insert(name.to_string(), (seq, user));
    }

    pub fn by_access_key(&self, key: &str) -> Option<Rc<User>> {
        self.by_key.get(key).cloned()
    }

    pub fn by_name(&self, name: &str) -> Option<Rc<User>> {
        self.by_name.get(name).and_then(|(_, u)| u.clone())
    }

    /// Every user, by name.
    pub fn list(&self) -> Vec<Rc<User>> {
        let mut all: Vec<Rc<User>> = self
            .by_name
            .values()
            .filter_map(|(_, u)| u.clone())
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }
}
