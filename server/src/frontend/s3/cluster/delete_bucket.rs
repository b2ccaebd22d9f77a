//! DeleteBucket on a cluster node. Every acknowledged write of a key is
//! held by its placement group's acting primary (an up node that caught
//! up), and only the acting primary admits clients' writes. So the door
//! closes the bucket to clients' writes on every up node and asks each
//! whether it leads a group holding any version of any key of it, or has
//! a write into it in progress (`POST /_percore/close`); if none does,
//! it deletes the bucket in the catalog while the map is still at that
//! epoch and the holds still stand; else it reopens them and answers
//! BucketNotEmpty. Down nodes are not asked: what they hold of the bucket
//! is older than what the acting primaries hold, and they drop it when
//! they see the catalog's record of the deletion (`catalog::apply`).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{catalog_check, lead_check, outcome_result, peer_of, slow_down, unavailable, Peer};
use crate::cluster::catalog;
use crate::cluster::shardmap::ShardMap;
use crate::frontend::s3::error::S3Error;
use crate::frontend::s3::S3Front;
use crate::metrics::ShardMetrics;
use crate::shard::msg::ShardError;
use crate::store::ListItem;

/// How long a node holds a bucket closed to clients' writes for a
/// DeleteBucket, beyond the takeover wait of the longest lease in the map
/// (the hold lapses by itself if the door goes away: writes into the
/// bucket are answered 503 until then). It must stand until every node
/// that serves has applied the delete or stopped serving its copy of the
/// catalog: the delete is begun within `COMMIT_BY`, its transaction (the
/// first etcd call of it) ends within the etcd client's timeouts (about
/// 20 s for each member it tries: an etcd of up to five members is
/// allowed for), and a node that
/// has not applied it serves its copy for at most the takeover wait after
/// (`catalog::change`).
const CLOSE_HOLD_BASE: Duration = Duration::from_secs(120);
/// The most a node holds a bucket closed for.
const CLOSE_HOLD_MAX: Duration = Duration::from_secs(15 * 60);
/// The catalog's delete is begun within this after the holds were asked
/// for, or not at all (the holds end then).
const COMMIT_BY: Duration = Duration::from_secs(10);
/// Keys looked at per page for one this node leads.
const PAGE: usize = 1000;

fn not_empty() -> S3Error {
    S3Error::new(
        409,
        "BucketNotEmpty",
        "The bucket you tried to delete is not empty.",
    )
}

impl S3Front {
    /// DeleteBucket on a cluster node (see the module's comment); Ok(false)
    /// on a single node.
    pub(in crate::frontend::s3) async fn cluster_delete_bucket(
        &self,
        bucket: &str,
    ) -> Result<bool, S3Error> {
        let Some(map) = self.map()? else {
            return Ok(false);
        };
        let owner = self.authorized_owner(bucket);
        if !map.all_groups_served() {
            return Err(unavailable(
                "Some placement groups have no replica up: whether the bucket is empty cannot be known; retry when nodes return.",
            ));
        }
        lead_check(&map, None)?;
        let mut to = Vec::new();
        if let Some(me) = map.node(map.node_id) {
            to.push(peer_of(me)?);
        }
        for n in map.listing_peers() {
            to.push(peer_of(n)?);
        }
        let token: u64 = rand::random();
        let asked = Instant::now();
        let ttl_ms = map.nodes.iter().map(|n| n.ttl_ms).max().unwrap_or(0);
        let hold = CLOSE_HOLD_BASE
            + Duration::from_millis(crate::cluster::control::takeover_wait_ms(ttl_ms));
        if hold > CLOSE_HOLD_MAX {
            return Err(unavailable(
                "DeleteBucket is not made on a cluster whose leases are this long (a hold on the bucket would outlast its limit); use leases under 10 minutes",
            ));
        }
        let close = json!({
            "bucket": bucket,
            "token": token,
            "epoch": map.epoch,
            "hold_ms": hold.as_millis() as u64,
        });
        let calls = to.iter().map(|peer| self.peer_close(&map, peer, &close));
        let mut verdict = Ok(());
        for (peer, got) in to.iter().zip(futures::future::join_all(calls).await) {
            let why = match got {
                Ok(v) if v["missing"].as_bool() == Some(true) => unavailable(format!(
                    "cluster node {} has not applied the bucket's creation yet; retry",
                    peer.name
                )),
                Ok(v)
                    if v["writing"].as_u64() == Some(0) && v["owned"].as_bool() == Some(false) =>
                {
                    continue
                }
                Ok(v) if v["writing"].is_u64() && v["owned"].is_boolean() => not_empty(),
                Ok(v) => unavailable(format!(
                    "cluster node {} answered the close of the bucket with {v}; retry",
                    peer.name
                )),
                Err(e) => e,
            };
            // A bucket that holds keys says so rather than a node's error.
            if verdict.is_ok() || why.code == "BucketNotEmpty" {
                verdict = Err(why);
            }
        }
        if let Err(e) = verdict {
            self.reopen(&map, bucket, token, &to).await;
            return Err(e);
        }
        if Instant::now() > asked + COMMIT_BY {
            self.reopen(&map, bucket, token, &to).await;
            return Err(unavailable(
                "The nodes took too long to check the bucket is empty; retry.",
            ));
        }
        let change = catalog::Change::Delete {
            name: bucket.to_string(),
            owner,
            epoch: Some(map.epoch),
        };
        ShardMetrics::add(&self.shard.metrics().cluster_fanned_out, 1);
        let outcome =
            catalog::change_by(&self.shard, &self.cluster_key(), change, asked + COMMIT_BY)
                .await
                // In force or not: the holds are left to lapse (a write into
                // the bucket now could be dropped with it).
                .map_err(unavailable)?;
        match outcome {
            catalog::Outcome::Done => Ok(true),
            catalog::Outcome::Moved => {
                self.reopen(&map, bucket, token, &to).await;
                Err(unavailable(
                    "The cluster map changed while the bucket was checked; retry.",
                ))
            }
            other => {
                self.reopen(&map, bucket, token, &to).await;
                outcome_result(other).map(|()| true)
            }
        }
    }

    /// Ends the holds of `token` (best effort: they lapse by themselves).
    async fn reopen(&self, map: &ShardMap, bucket: &str, token: u64, to: &[Peer]) {
        let body = json!({ "bucket": bucket, "token": token, "epoch": map.epoch, "reopen": true });
        let calls = to.iter().map(|peer| self.peer_close(map, peer, &body));
        for (peer, got) in to.iter().zip(futures::future::join_all(calls).await) {
            if let Err(e) = got {
                tracing::info!(node = %peer.name, bucket, error = %e.message, "cluster: a DeleteBucket's hold not ended; it lapses by itself");
            }
        }
    }

    /// `POST /_percore/close` to `peer`: its JSON answer.
    async fn peer_close(
        &self,
        map: &ShardMap,
        peer: &Peer,
        body: &Value,
    ) -> Result<Value, S3Error> {
        let body = body.to_string();
        let (status, answer) = self
            .peer_post(map, peer, "/_percore/close", body.as_bytes(), 4096)
            .await
            .map_err(|e| {
                unavailable(format!(
                    "cluster node {} cannot be reached to check the bucket is empty: {e}; retry",
                    peer.name
                ))
            })?;
        if status != 200 {
            return Err(unavailable(format!(
                "cluster node {} answered {status} to the bucket's close: {}; retry",
                peer.name,
                String::from_utf8_lossy(&answer)
            )));
        }
        serde_json::from_slice(&answer).map_err(|e| {
            unavailable(format!(
                "cluster node {} answered the bucket's close with bad JSON ({e}); retry",
                peer.name
            ))
        })
    }

    /// Answers `POST /_percore/close`: `{"bucket", "token", "epoch",
    /// "hold_ms"}` closes the bucket here to clients' writes for that long
    /// and answers `{"writing": writes in progress, "owned": whether a
    /// group this node leads holds a version of a key of it}` (or
    /// `{"missing": true}`); with `"reopen": true`, ends that hold.
    pub(in crate::frontend::s3) async fn answer_close(
        &self,
        map: &ShardMap,
        body: &[u8],
    ) -> Result<Value, S3Error> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Close {
            bucket: String,
            token: u64,
            epoch: u64,
            #[serde(default)]
            hold_ms: u64,
            #[serde(default)]
            reopen: bool,
        }
        let req: Close = serde_json::from_slice(body)
            .map_err(|e| S3Error::invalid_argument(format!("bad close request: {e}")))?;
        if req.reopen {
            self.shard.reopen_bucket(&req.bucket, req.token).await;
            return Ok(json!({}));
        }
        if req.epoch != map.epoch {
            return Err(slow_down(format!(
                "this node's cluster map is at epoch {}, the request's at {}; retry",
                map.epoch, req.epoch
            )));
        }
        lead_check(map, None)?;
        catalog_check()?;
        let hold = Duration::from_millis(req.hold_ms);
        if hold.is_zero() || hold > CLOSE_HOLD_MAX {
            return Err(S3Error::invalid_argument(format!(
                "bad close request: hold_ms must be 1 to {}",
                CLOSE_HOLD_MAX.as_millis()
            )));
        }
        if !crate::frontend::common::valid_bucket_name(&req.bucket) {
            return Err(S3Error::invalid_argument("bad close request: bucket name"));
        }
        let writing = match self
            .shard
            .close_bucket(&req.bucket, req.token, Instant::now() + hold)
            .await
        {
            Ok(n) => n,
            Err(ShardError::NoSuchBucket) => return Ok(json!({ "missing": true })),
            Err(e) => {
                // Some shards may hold it: end this hold here.
                self.shard.reopen_bucket(&req.bucket, req.token).await;
                return Err(e.into());
            }
        };
        let owned = self.leads_a_key_of(map, &req.bucket).await?;
        Ok(json!({ "writing": writing, "owned": owned }))
    }

    /// Whether any version of any key of `bucket` here is in a group this
    /// node leads under `map`.
    async fn leads_a_key_of(&self, map: &ShardMap, bucket: &str) -> Result<bool, S3Error> {
        let mut from = String::new();
        loop {
            let got = self
                .shard
                .list_merged(bucket, "", &from, None, PAGE, Some(None))
                .await;
            let (items, truncated) = match got {
                Ok(page) => page,
                Err(ShardError::NoSuchBucket) => return Ok(false),
                Err(e) => return Err(e.into()),
            };
            for item in &items {
                if let ListItem::Object { key, .. } | ListItem::Versions { key, .. } = item {
                    if map.primary_of(bucket, key) == map.node_id {
                        return Ok(true);
                    }
                }
            }
            match items.last() {
                Some(last) if truncated => from = last.name().to_string(),
                _ => return Ok(false),
            }
        }
    }
}
