//! Users across shards, as bucket configurations are: a change goes to the
//! bucket-owner shard, which stores the record durably and applies it on
//! every shard before it answers, so that a key is usable (or refused) on
//! every connection once `percore user add` (or `remove`) returns.

use std::rc::Rc;

use bytes::Bytes;

use super::msg::{Op, Reply, ShardError};
use super::{store_error, Shard, BUCKET_OWNER_SHARD};
use crate::access::users::User;

impl Shard {
    /// The user holding `access_key`, on this shard's table.
    pub fn user_by_access_key(&self, access_key: &str) -> Option<Rc<User>> {
        self.users.borrow().by_access_key(access_key)
    }

    pub fn user_by_name(&self, name: &str) -> Option<Rc<User>> {
        self.users.borrow().by_name(name)
    }

    pub fn user_list(&self) -> Vec<Rc<User>> {
        self.users.borrow().list()
    }

    /// Stores (Some) or removes (None) a user, everywhere.
    pub async fn set_user(
        self: &Rc<Self>,
        name: &str,
        user: Option<&User>,
    ) -> Result<(), ShardError> {
        let op = Op::UserSet {
            name: name.into(),
            doc: user.map(|u| Bytes::from(u.to_doc())),
        };
        match self.call(BUCKET_OWNER_SHARD, op).await {
            Reply::Ok => Ok(()),
            Reply::Err(e) => Err(e),
            other => Err(ShardError::Internal(format!("unexpected reply {other:?}"))),
        }
    }

    /// UserSet, on the bucket-owner shard.
    pub(super) async fn user_set(self: &Rc<Self>, name: String, doc: Option<Bytes>) -> Reply {
        debug_assert_eq!(self.id, BUCKET_OWNER_SHARD);
        let _serial = self.config_writes.lock().await;
        let seq = match self.store.user_set(&name, doc.clone()).await {
            Ok(seq) => seq,
            Err(e) => return Reply::Err(store_error(e)),
        };
        let applied = self
            .call_all(|| Op::UserApply {
                name: name.clone(),
                seq,
                doc: doc.clone(),
            })
            .await;
        super::bucket_config::all_applied(&applied)
    }

    /// At start-up, on the bucket-owner shard: every stored user to every
    /// shard, before anyone serves.
    pub(super) async fn publish_users(self: &Rc<Self>) {
        let users = match self.store.users().await {
            Ok(users) => users,
            Err(e) => {
                // Their keys will not work; the root keys still do.
                tracing::error!("could not read the users: {e}");
                return;
            }
        };
        for (name, seq, doc) in users {
            self.call_all(|| Op::UserApply {
                name: name.clone(),
                seq,
                doc: Some(doc.clone()),
            })
            .await;
        }
    }
}
