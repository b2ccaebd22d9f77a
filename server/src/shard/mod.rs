//! The per-core shard: its store, its replicated bucket view, and the
//! channels to every other shard.
//!
//! A request that arrives on shard A for a key owned by shard B is sent to B as
//! an `Op` over a bounded single-producer channel (A -> B); B runs it on its
//! own executor and the `Reply` comes back over B -> A. Nothing is shared
//! between shards but these channels.
//!
//! Buckets live on the bucket-owner shard (shard 0) as durable records; every
//! shard keeps a read-only copy of the bucket set, updated by shard 0 before
//! it acknowledges a CreateBucket or DeleteBucket.

pub mod msg;
pub mod object;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::channel::oneshot;
use glommio::channels::shared_channel::{
    ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender,
};
use percore_protocol::routing;

use crate::metrics::{ShardMetrics, ShardSnapshot, Stage};
use crate::store::record::ObjectMeta;
use crate::store::{ObjectReader, PutCondition, PutWriter, Store, StoreError};
use msg::{Msg, Op, Reply, SessionId, ShardError};

/// The shard that holds bucket records.
pub const BUCKET_OWNER_SHARD: usize = 0;
/// Messages queued per directed shard pair before senders wait.
pub const CHANNEL_CAPACITY: usize = 1024;
/// Longest wait for another shard to take a message and reply, by default
/// (`cross_shard_timeout_s`; `Shard::set_timeouts`).
pub const CALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// A session held for another shard that sees no operation for this long is
/// closed, by default (`session_idle_timeout_s`; `Shard::set_timeouts`):
/// the backstop for a caller that went away without closing it.
pub const SESSION_IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(300);
/// Open read/put sessions held for other shards, per shard.
pub const SESSIONS_MAX: usize = 4096;

/// One end of the channels from and to every other shard, built on the main
/// thread and moved into each shard's thread.
pub struct Wiring {
    /// `to[j]`: sender to shard j (None for self).
    pub to: Vec<Option<SharedSender<Msg>>>,
    /// `from[j]`: receiver from shard j (None for self).
    pub from: Vec<Option<SharedReceiver<Msg>>>,
}

/// Builds the full mesh of directed channels for `n` shards.
pub fn wire(n: usize) -> Vec<Wiring> {
    let mut wirings: Vec<Wiring> = (0..n)
        .map(|_| Wiring {
            to: (0..n).map(|_| None).collect(),
            from: (0..n).map(|_| None).collect(),
        })
        .collect();
    for i in 0..n {
        for j in 0..n {
            if i != j {
                let (tx, rx) = glommio::channels::shared_channel::new_bounded(CHANNEL_CAPACITY);
                wirings[i].to[j] = Some(tx);
                wirings[j].from[i] = Some(rx);
            }
        }
    }
    wirings
}

#[derive(Debug, Clone)]
pub struct BucketView {
    pub created_ms: u64,
    /// Set while shard 0 checks emptiness for a DeleteBucket.
    pub locked: bool,
}

enum Session {
    Read(ObjectReader),
    Put(PutWriter),
}

/// A session held for another shard, in the owner's table.
struct SessionSlot {
    state: SessionState,
    /// When the last operation on it ended (or it was opened).
    last_used: Instant,
}

enum SessionState {
    /// Between operations.
    Idle(Session),
    /// An operation (ReadChunk, PutData, PutFinish) has it out of the table.
    /// `close`: a close arrived meanwhile; the session ends when the
    /// operation gives it back.
    Busy { close: bool },
}

pub struct Shard {
    pub id: usize,
    pub count: usize,
    pub seed: u64,
    pub store: Store,
    senders: RefCell<Vec<Option<Rc<ConnectedSender<Msg>>>>>,
    pending: RefCell<HashMap<u64, oneshot::Sender<Reply>>>,
    next_request_id: Cell<u64>,
    buckets: RefCell<BTreeMap<String, BucketView>>,
    /// PUTs in progress per bucket on this shard (for DeleteBucket).
    puts_in_flight: RefCell<HashMap<String, usize>>,
    sessions: RefCell<HashMap<SessionId, SessionSlot>>,
    next_session: Cell<SessionId>,
    /// Longest wait for another shard (CALL_TIMEOUT_DEFAULT).
    call_timeout: Cell<Duration>,
    /// Idle sessions are closed after this (SESSION_IDLE_TIMEOUT_DEFAULT).
    session_idle_timeout: Cell<Duration>,
    /// Calls to other shards that timed out.
    calls_timed_out: Cell<u64>,
    /// Sessions opened for this shard whose open reply came after the call
    /// gave up (or after its caller went away), and which this shard then
    /// told the owner to close.
    orphans_closed: Cell<u64>,
    /// Sessions held for other shards closed for being idle too long.
    sessions_expired: Cell<u64>,
    started: Cell<bool>,
    start_waiters: RefCell<Vec<oneshot::Sender<()>>>,
    pub metrics: ShardMetrics,
    /// The shard's own io_uring data ring with its registered buffers (the
    /// zero-copy GET path); None when it could not be set up.
    pub ring: RefCell<Option<Rc<crate::ring::DataRing>>>,
}

impl Shard {
    pub fn new(id: usize, count: usize, seed: u64, store: Store) -> Rc<Shard> {
        assert!(id < count);
        Rc::new(Shard {
            id,
            count,
            seed,
            store,
            senders: RefCell::new(Vec::new()),
            pending: RefCell::new(HashMap::new()),
            next_request_id: Cell::new(1),
            buckets: RefCell::new(BTreeMap::new()),
            puts_in_flight: RefCell::new(HashMap::new()),
            sessions: RefCell::new(HashMap::new()),
            next_session: Cell::new(1),
            call_timeout: Cell::new(CALL_TIMEOUT_DEFAULT),
            session_idle_timeout: Cell::new(SESSION_IDLE_TIMEOUT_DEFAULT),
            calls_timed_out: Cell::new(0),
            orphans_closed: Cell::new(0),
            sessions_expired: Cell::new(0),
            started: Cell::new(false),
            start_waiters: RefCell::new(Vec::new()),
            metrics: ShardMetrics::default(),
            ring: RefCell::new(None),
        })
    }

    /// Sets the longest wait for another shard (`call`) and the idle time
    /// after which a session held for another shard is closed.
    pub fn set_timeouts(&self, call: Duration, session_idle: Duration) {
        self.call_timeout.set(call.max(Duration::from_millis(1)));
        self.session_idle_timeout
            .set(session_idle.max(Duration::from_millis(1)));
    }

    /// Sessions this shard holds for other shards (open reads and PUTs).
    pub fn sessions_open(&self) -> usize {
        self.sessions.borrow().len()
    }

    /// Connects the channels and starts one receive task per peer. Each
    /// connect waits for the other end, so all of them run concurrently.
    /// Also starts the task that closes idle sessions.
    pub async fn connect(self: &Rc<Self>, wiring: Wiring) {
        let senders = futures::future::join_all(wiring.to.into_iter().map(|tx| async move {
            match tx {
                Some(tx) => Some(Rc::new(tx.connect().await)),
                None => None,
            }
        }));
        let receivers = futures::future::join_all(wiring.from.into_iter().map(|rx| async move {
            match rx {
                Some(rx) => Some(rx.connect().await),
                None => None,
            }
        }));
        let (senders, receivers) = futures::future::join(senders, receivers).await;
        *self.senders.borrow_mut() = senders;
        for (peer, rx) in receivers.into_iter().enumerate() {
            if let Some(rx) = rx {
                let me = self.clone();
                glommio::spawn_local(async move { me.receive_loop(peer, rx).await }).detach();
            }
        }
        let weak = Rc::downgrade(self);
        glommio::spawn_local(async move {
            loop {
                let period = match weak.upgrade() {
                    Some(me) => (me.session_idle_timeout.get() / 4)
                        .clamp(Duration::from_millis(10), Duration::from_secs(10)),
                    None => break,
                };
                glommio::timer::sleep(period).await;
                match weak.upgrade() {
                    Some(me) => me.expire_idle_sessions(),
                    None => break,
                }
            }
        })
        .detach();
    }

    async fn receive_loop(self: Rc<Self>, peer: usize, rx: ConnectedReceiver<Msg>) {
        while let Some(msg) = rx.recv().await {
            match msg {
                Msg::Req { id, op, sent } => {
                    self.metrics.stage(Stage::Queue).record(sent.elapsed());
                    let me = self.clone();
                    glommio::spawn_local(async move {
                        let reply = me.execute(op).await;
                        let tx = me.senders.borrow()[peer].clone().expect("peer sender");
                        let _ = tx.send(Msg::Resp { id, reply }).await;
                    })
                    .detach();
                }
                Msg::Resp { id, reply } => {
                    let waiter = self.pending.borrow_mut().remove(&id);
                    let orphan = match waiter {
                        Some(waiter) => waiter.send(reply).err(),
                        // The call timed out or its caller went away.
                        None => Some(reply),
                    };
                    if let Some(reply) = orphan {
                        self.release_orphan(peer, reply);
                    }
                }
            }
        }
    }

    /// A reply nobody waits for any more: if it opened a session on `peer`,
    /// tell `peer` to close it (else it would hold its reader or PUT, with
    /// the PUT's pinned segments and the bucket's in-flight count, until it
    /// expired).
    fn release_orphan(self: &Rc<Self>, peer: usize, reply: Reply) {
        let close = match reply {
            Reply::Opened { session, .. } => Op::ReadClose { session },
            Reply::Session(session) => Op::PutAbort { session },
            _ => return,
        };
        self.orphans_closed.set(self.orphans_closed.get() + 1);
        tracing::warn!(
            shard = self.id,
            peer,
            "closing a session on shard {peer} opened for a call that gave up"
        );
        let me = self.clone();
        glommio::spawn_local(async move {
            me.call(peer, close).await;
        })
        .detach();
    }

    /// The shard that owns (bucket, key): the one placement function.
    pub fn owner_of(&self, bucket: &str, key: &str) -> usize {
        routing::owner_shard(self.seed, self.count, bucket.as_bytes(), key.as_bytes())
    }

    /// The first `max` items after `from` across all shards, in key order,
    /// and whether more follow.
    ///
    /// A k-way merge with a cursor per shard: each shard is asked for about
    /// twice its fair share (`2 * max / shards`, at least 16) and asked again
    /// only when its buffered items run out before the page is full, so a
    /// page costs about `2 * max` items of shard work whatever the shard
    /// count (not `shards * max`).
    pub async fn list_merged(
        self: &Rc<Self>,
        bucket: &str,
        prefix: &str,
        from: &str,
        delimiter: Option<String>,
        max: usize,
    ) -> Result<(Vec<crate::store::ListItem>, bool), ShardError> {
        use std::collections::VecDeque;
        let n = self.count;
        let batch = (2 * max).div_ceil(n).max(16).min(max + 1);
        let mut cursors: Vec<String> = vec![from.to_string(); n];
        let mut buffered: Vec<VecDeque<crate::store::ListItem>> = vec![VecDeque::new(); n];
        let mut exhausted = vec![false; n];
        let mut asked = vec![false; n];
        let mut out: Vec<crate::store::ListItem> = Vec::with_capacity(max.min(1024));
        loop {
            let starved: Vec<usize> = (0..n)
                .filter(|&i| buffered[i].is_empty() && !exhausted[i])
                .collect();
            if !starved.is_empty() {
                let calls = starved.iter().map(|&i| {
                    self.call(
                        i,
                        Op::List {
                            bucket: bucket.to_string(),
                            prefix: prefix.to_string(),
                            start_after: cursors[i].clone(),
                            delimiter: delimiter.clone(),
                            limit: batch,
                        },
                    )
                });
                let replies = futures::future::join_all(calls).await;
                for (&i, reply) in starved.iter().zip(replies) {
                    match reply {
                        Reply::List(items) => {
                            // No-progress guard: a shard's page must be
                            // strictly increasing and after its cursor,
                            // or asking again could loop forever.
                            // (The first page may start with a common
                            // prefix that sorts before the caller's marker.)
                            let mut prev = asked[i].then_some(cursors[i].as_str());
                            for item in &items {
                                if prev.is_some_and(|p| item.name() <= p) {
                                    tracing::error!(
                                        shard = self.id,
                                        peer = i,
                                        "listing made no progress after {prev:?}"
                                    );
                                    return Err(ShardError::Internal(format!(
                                        "shard {i} listed {:?} after {prev:?}: listing made no progress",
                                        item.name()
                                    )));
                                }
                                prev = Some(item.name());
                            }
                            asked[i] = true;
                            exhausted[i] = items.len() < batch;
                            if let Some(last) = items.last() {
                                cursors[i] = last.name().to_string();
                            }
                            buffered[i].extend(items);
                        }
                        Reply::Err(e) => return Err(e),
                        other => {
                            return Err(ShardError::Internal(format!("unexpected reply {other:?}")))
                        }
                    }
                }
                continue;
            }
            // Every shard has a head item or is exhausted: take the least.
            let Some(i) = (0..n)
                .filter(|&i| !buffered[i].is_empty())
                .min_by(|&a, &b| buffered[a][0].name().cmp(buffered[b][0].name()))
            else {
                return Ok((out, false));
            };
            let item = buffered[i].pop_front().expect("non-empty");
            // A common prefix can come from several shards.
            if out.last().is_some_and(|l| l.name() == item.name()) {
                continue;
            }
            if out.len() == max {
                return Ok((out, true));
            }
            out.push(item);
        }
    }

    /// Runs `op` on shard `target`: directly if that is us, else by message.
    ///
    /// Bounded wait (`call_timeout`, from queueing the message to the
    /// reply): a stalled owner costs the client a 503, not a hung
    /// connection. The op may still complete on the owner (an S3 5xx is an
    /// indeterminate outcome); its late reply finds no waiter, and a session
    /// it opened is closed again (`release_orphan`). The same holds when the
    /// caller drops this future before the reply.
    pub async fn call(self: &Rc<Self>, target: usize, op: Op) -> Reply {
        if target == self.id {
            return self.execute(op).await;
        }
        let id = self.next_request_id.get();
        self.next_request_id.set(id + 1);
        let (tx, rx) = oneshot::channel();
        self.pending.borrow_mut().insert(id, tx);
        // Dropped with `exchange` (answered, timed out or cancelled).
        let mut pending = PendingCall {
            shard: self.clone(),
            id,
            target,
            rx,
        };
        let sender = self.senders.borrow()[target]
            .clone()
            .expect("sender to peer");
        let sent = Instant::now();
        let timeout = self.call_timeout.get();
        // Ops whose loss would leave state behind on the target (a bucket
        // locked or missing there, a session open) are queued however long
        // that takes, as before; the timeout then bounds the reply only.
        // Any other op that cannot even be queued in time is dropped.
        let must_deliver = matches!(
            op,
            Op::BucketApply { .. }
                | Op::BucketUnlock { .. }
                | Op::Start
                | Op::ReadClose { .. }
                | Op::PutAbort { .. }
        );
        let mut msg = Some(Msg::Req { id, op, sent });
        if must_deliver {
            let msg = msg.take().expect("not sent yet");
            if sender.send(msg).await.is_err() {
                return Reply::Err(ShardError::ShuttingDown);
            }
        }
        let me = self.clone();
        let exchange = async move {
            if let Some(msg) = msg {
                if sender.send(msg).await.is_err() {
                    return Reply::Err(ShardError::ShuttingDown);
                }
            }
            let reply = (&mut pending.rx)
                .await
                .unwrap_or(Reply::Err(ShardError::ShuttingDown));
            me.metrics.stage(Stage::Hop).record(sent.elapsed());
            reply
        };
        let timer = glommio::timer::sleep(timeout);
        let outcome = futures::future::select(Box::pin(exchange), Box::pin(timer)).await;
        match outcome {
            futures::future::Either::Left((reply, _)) => reply,
            futures::future::Either::Right(_) => {
                self.calls_timed_out.set(self.calls_timed_out.get() + 1);
                tracing::warn!(
                    shard = self.id,
                    target,
                    "cross-shard call timed out after {timeout:?}"
                );
                Reply::Err(ShardError::Busy)
            }
        }
    }

    /// Runs `op` on every shard concurrently; replies in shard order.
    pub async fn call_all(self: &Rc<Self>, make: impl Fn() -> Op) -> Vec<Reply> {
        let calls: Vec<_> = (0..self.count).map(|s| self.call(s, make())).collect();
        futures::future::join_all(calls).await
    }

    /// Waits for the bucket-owner shard's start signal.
    pub async fn wait_started(&self) {
        if self.started.get() {
            return;
        }
        let (tx, rx) = oneshot::channel();
        self.start_waiters.borrow_mut().push(tx);
        let _ = rx.await;
    }

    // ----------------------------------------------------------------------
    // Buckets (replicated view)
    // ----------------------------------------------------------------------

    pub fn bucket_exists(&self, name: &str) -> bool {
        self.buckets.borrow().get(name).is_some_and(|b| !b.locked)
    }

    pub fn bucket_list(&self) -> Vec<(String, u64)> {
        self.buckets
            .borrow()
            .iter()
            .map(|(n, b)| (n.clone(), b.created_ms))
            .collect()
    }

    /// On the bucket-owner shard at start-up: push the recovered bucket set
    /// to every shard before anyone serves requests.
    pub async fn publish_buckets(self: &Rc<Self>) {
        assert_eq!(self.id, BUCKET_OWNER_SHARD);
        for (name, created_ms) in self.store.bucket_records() {
            for s in 0..self.count {
                self.call(
                    s,
                    Op::BucketApply {
                        name: name.clone(),
                        created_ms: Some(created_ms),
                    },
                )
                .await;
            }
        }
    }

    async fn bucket_create(self: &Rc<Self>, name: String) -> Reply {
        debug_assert_eq!(self.id, BUCKET_OWNER_SHARD);
        match self.store.bucket_create(&name).await {
            Ok(true) => {}
            Ok(false) => return Reply::Created(false),
            Err(e) => return Reply::Err(store_error(e)),
        }
        let created_ms = self
            .store
            .bucket_records()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, c)| c);
        self.call_all(|| Op::BucketApply {
            name: name.clone(),
            created_ms: Some(created_ms),
        })
        .await;
        Reply::Created(true)
    }

    /// Lock the bucket everywhere, count its objects and writes in progress
    /// (PUTs, parts, CreateMultipartUpload, completions), delete if none.
    /// Multipart uploads do not count: the durable bucket record is the
    /// commit point, after which every shard drops the bucket's uploads and
    /// parts (`BucketApply` with no `created_ms`; see `store::mpu`).
    async fn bucket_delete(self: &Rc<Self>, name: String) -> Reply {
        debug_assert_eq!(self.id, BUCKET_OWNER_SHARD);
        if !self.bucket_exists(&name) {
            return Reply::Err(ShardError::NoSuchBucket);
        }
        let counts = self
            .call_all(|| Op::BucketLock { name: name.clone() })
            .await;
        let objects: usize = counts
            .iter()
            .map(|r| if let Reply::Count(n) = r { *n } else { 1 })
            .sum();
        if objects > 0 {
            self.call_all(|| Op::BucketUnlock { name: name.clone() })
                .await;
            return Reply::Err(ShardError::BucketNotEmpty);
        }
        if let Err(e) = self.store.bucket_delete(&name).await {
            self.call_all(|| Op::BucketUnlock { name: name.clone() })
                .await;
            return Reply::Err(store_error(e));
        }
        self.call_all(|| Op::BucketApply {
            name: name.clone(),
            created_ms: None,
        })
        .await;
        Reply::Ok
    }

    /// Tracks a PUT into `bucket` so that DeleteBucket sees it.
    fn put_started(&self, bucket: &str) {
        *self
            .puts_in_flight
            .borrow_mut()
            .entry(bucket.to_string())
            .or_default() += 1;
    }

    /// Drops the uploads and parts of a deleted `bucket` on this shard. A
    /// failure is logged: the purge is tried again at the next start and
    /// before a bucket of this name is created again.
    async fn purge_multipart(&self, bucket: &str) {
        match self.store.mpu_purge_bucket(bucket).await {
            Ok(0) => {}
            Ok(dropped) => tracing::info!(
                shard = self.id,
                bucket,
                dropped,
                "dropped the multipart uploads and parts of a deleted bucket"
            ),
            Err(e) => tracing::warn!(
                shard = self.id,
                bucket,
                "could not drop the multipart uploads of a deleted bucket: {e}"
            ),
        }
    }

    fn put_ended(&self, bucket: &str) {
        let mut map = self.puts_in_flight.borrow_mut();
        if let Some(n) = map.get_mut(bucket) {
            *n -= 1;
            if *n == 0 {
                map.remove(bucket);
            }
        }
    }

    // ----------------------------------------------------------------------
    // Executing operations on the owner
    // ----------------------------------------------------------------------

    fn new_session(&self, s: Session) -> Result<SessionId, ShardError> {
        let mut sessions = self.sessions.borrow_mut();
        if sessions.len() >= SESSIONS_MAX {
            return Err(ShardError::Busy);
        }
        let id = self.next_session.get();
        self.next_session.set(id + 1);
        sessions.insert(
            id,
            SessionSlot {
                state: SessionState::Idle(s),
                last_used: Instant::now(),
            },
        );
        Ok(id)
    }

    /// Takes a session out of the table for one operation; it stays listed
    /// (busy) so that a close arriving meanwhile is not lost.
    fn session_take(&self, id: SessionId) -> Result<Session, ShardError> {
        let mut sessions = self.sessions.borrow_mut();
        let Some(slot) = sessions.get_mut(&id) else {
            return Err(ShardError::Internal(
                "unknown session (closed, or expired after being idle)".into(),
            ));
        };
        match std::mem::replace(&mut slot.state, SessionState::Busy { close: false }) {
            SessionState::Idle(s) => Ok(s),
            busy @ SessionState::Busy { .. } => {
                slot.state = busy;
                Err(ShardError::Internal(
                    "session already has an operation in progress".into(),
                ))
            }
        }
    }

    /// Gives a session back after an operation, or ends it if a close came
    /// while the operation ran.
    fn session_return(&self, id: SessionId, s: Session) {
        let mut sessions = self.sessions.borrow_mut();
        match sessions.get_mut(&id) {
            Some(slot) if matches!(slot.state, SessionState::Busy { close: false }) => {
                slot.state = SessionState::Idle(s);
                slot.last_used = Instant::now();
            }
            _ => {
                sessions.remove(&id);
                drop(sessions);
                self.session_ended(s);
            }
        }
    }

    /// Removes a session taken by `session_take` that its operation used up
    /// (finished or failed); the caller disposes of it.
    fn session_remove(&self, id: SessionId) {
        self.sessions.borrow_mut().remove(&id);
    }

    /// Closes a session now, or when its running operation ends.
    fn session_close(&self, id: SessionId) {
        let mut sessions = self.sessions.borrow_mut();
        let Some(slot) = sessions.get_mut(&id) else {
            return;
        };
        match &mut slot.state {
            SessionState::Busy { close } => *close = true,
            SessionState::Idle(_) => {
                let slot = sessions.remove(&id).expect("listed");
                drop(sessions);
                if let SessionState::Idle(s) = slot.state {
                    self.session_ended(s);
                }
            }
        }
    }

    /// Releases what a session held: its reader, or its unfinished PUT (the
    /// writer's pinned segments, and the bucket's in-flight count).
    fn session_ended(&self, s: Session) {
        if let Session::Put(w) = s {
            self.put_ended(w.bucket());
        }
    }

    /// Closes sessions idle for longer than `session_idle_timeout`: their
    /// caller went away without closing them (or its close was lost).
    pub fn expire_idle_sessions(&self) {
        let idle = self.session_idle_timeout.get();
        let now = Instant::now();
        let expired: Vec<Session> = {
            let mut sessions = self.sessions.borrow_mut();
            let ids: Vec<SessionId> = sessions
                .iter()
                .filter(|(_, slot)| {
                    matches!(slot.state, SessionState::Idle(_))
                        && now.saturating_duration_since(slot.last_used) > idle
                })
                .map(|(id, _)| *id)
                .collect();
            ids.iter()
                .filter_map(|id| match sessions.remove(id)?.state {
                    SessionState::Idle(s) => Some(s),
                    SessionState::Busy { .. } => None,
                })
                .collect()
        };
        if expired.is_empty() {
            return;
        }
        self.sessions_expired
            .set(self.sessions_expired.get() + expired.len() as u64);
        tracing::warn!(
            shard = self.id,
            count = expired.len(),
            "closed sessions idle for more than {idle:?}"
        );
        for s in expired {
            self.session_ended(s);
        }
    }

    /// Starts a local PUT (or multipart part) of `key`, counted against
    /// the bucket until it ends.
    pub fn open_writer(
        &self,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        part: Option<&(String, u32)>,
        condition: Option<PutCondition>,
    ) -> Result<PutWriter, ShardError> {
        if !self.bucket_exists(bucket) {
            return Err(ShardError::NoSuchBucket);
        }
        if let Some(c) = &condition {
            // Fail fast, before the body is sent; checked again at install.
            self.store
                .check_put_condition(bucket, key, c)
                .map_err(store_error)?;
        }
        let mut writer = match part {
            None => self.store.put_stream(bucket, key, meta),
            Some((upload_id, number)) => self
                .store
                .put_part_stream(bucket, key, upload_id, *number)
                .map_err(store_error)?,
        };
        if let Some(c) = condition {
            writer.set_condition(c);
        }
        self.put_started(bucket);
        Ok(writer)
    }

    pub async fn execute(self: &Rc<Self>, op: Op) -> Reply {
        match op {
            Op::Head { bucket, key } => Reply::Head(self.store.head(&bucket, &key)),
            Op::ReadOpen { bucket, key } => match self.store.open_read(&bucket, &key).await {
                Ok(reader) => {
                    let meta = reader.meta.clone();
                    match self.new_session(Session::Read(reader)) {
                        Ok(session) => Reply::Opened { session, meta },
                        Err(e) => Reply::Err(e),
                    }
                }
                Err(e) => Reply::Err(store_error(e)),
            },
            Op::ReadChunk {
                session,
                offset,
                len_bytes,
            } => {
                let mut reader = match self.session_take(session) {
                    Ok(Session::Read(r)) => r,
                    Ok(other) => {
                        self.session_return(session, other);
                        return Reply::Err(ShardError::Internal("not a read session".into()));
                    }
                    Err(e) => return Reply::Err(e),
                };
                let result = reader.read(offset, len_bytes).await;
                let reply = match result {
                    Ok(data) => Reply::Data(Bytes::copy_from_slice(&data)),
                    Err(e) => Reply::Err(store_error(e)),
                };
                self.session_return(session, Session::Read(reader));
                reply
            }
            Op::ReadClose { session } | Op::PutAbort { session } => {
                self.session_close(session);
                Reply::Ok
            }
            Op::PutOpen {
                bucket,
                key,
                meta,
                part,
                condition,
            } => {
                let writer = match self.open_writer(&bucket, &key, meta, part.as_ref(), condition) {
                    Ok(w) => w,
                    Err(e) => return Reply::Err(e),
                };
                match self.new_session(Session::Put(writer)) {
                    Ok(id) => Reply::Session(id),
                    Err(e) => {
                        self.put_ended(&bucket);
                        Reply::Err(e)
                    }
                }
            }
            Op::PutData { session, data } => {
                let mut w = match self.session_take(session) {
                    Ok(Session::Put(w)) => w,
                    Ok(other) => {
                        self.session_return(session, other);
                        return Reply::Err(ShardError::Internal("not a put session".into()));
                    }
                    Err(e) => return Reply::Err(e),
                };
                match w.write(data).await {
                    Ok(()) => {
                        self.session_return(session, Session::Put(w));
                        Reply::Ok
                    }
                    Err(e) => {
                        self.session_remove(session);
                        self.session_ended(Session::Put(w));
                        Reply::Err(store_error(e))
                    }
                }
            }
            Op::PutFinish {
                session,
                etag,
                headers,
            } => {
                let mut w = match self.session_take(session) {
                    Ok(Session::Put(w)) => w,
                    Ok(other) => {
                        self.session_return(session, other);
                        return Reply::Err(ShardError::Internal("not a put session".into()));
                    }
                    Err(e) => return Reply::Err(e),
                };
                // Listed (busy) until the object is installed, so that the
                // session count stays honest; a close meanwhile is moot.
                let bucket = w.bucket().to_string();
                w.set_etag(etag);
                w.add_headers(headers);
                let result = w.finish().await;
                self.session_remove(session);
                self.put_ended(&bucket);
                match result {
                    Ok(info) => Reply::Put(info),
                    Err(e) => Reply::Err(store_error(e)),
                }
            }
            Op::Delete { bucket, key } => match self.store.delete(&bucket, &key).await {
                Ok(existed) => Reply::Deleted(existed),
                Err(e) => Reply::Err(store_error(e)),
            },
            Op::List {
                bucket,
                prefix,
                start_after,
                delimiter,
                limit,
            } => Reply::List(self.store.list(
                &bucket,
                &prefix,
                &start_after,
                delimiter.as_deref(),
                limit,
            )),
            Op::MpuCreate { bucket, key, meta } => {
                if !self.bucket_exists(&bucket) {
                    return Reply::Err(ShardError::NoSuchBucket);
                }
                // A write in progress for DeleteBucket, which would otherwise
                // miss an upload installed after its purge.
                let _writing = WriteInProgress::new(self, &bucket);
                let result = self.store.mpu_create(&bucket, &key, meta).await;
                match result {
                    Ok(id) => Reply::Upload(id),
                    Err(e) => Reply::Err(store_error(e)),
                }
            }
            Op::MpuComplete {
                bucket,
                key,
                upload_id,
                parts,
            } => {
                if !self.bucket_exists(&bucket) {
                    return Reply::Err(ShardError::NoSuchBucket);
                }
                // Counted until done, even if this future is dropped (a
                // local call runs in its caller's future).
                let _writing = WriteInProgress::new(self, &bucket);
                let result = self
                    .store
                    .mpu_complete(&bucket, &key, &upload_id, &parts)
                    .await;
                match result {
                    Ok(info) => Reply::Put(info),
                    Err(e) => Reply::Err(store_error(e)),
                }
            }
            Op::MpuAbort {
                bucket,
                key,
                upload_id,
            } => match self.store.mpu_abort(&bucket, &key, &upload_id).await {
                Ok(()) => Reply::Ok,
                Err(e) => Reply::Err(store_error(e)),
            },
            Op::MpuParts {
                bucket,
                key,
                upload_id,
                after,
                limit,
            } => match self
                .store
                .mpu_parts(&bucket, &key, &upload_id, after, limit)
            {
                Ok(parts) => Reply::Parts(parts),
                Err(e) => Reply::Err(store_error(e)),
            },
            Op::MpuList {
                bucket,
                prefix,
                key_marker,
                upload_id_marker,
                limit,
            } => Reply::Uploads(self.store.mpu_list(
                &bucket,
                &prefix,
                &key_marker,
                &upload_id_marker,
                limit,
            )),
            Op::BucketCreate { name } => self.bucket_create(name).await,
            Op::BucketDelete { name } => self.bucket_delete(name).await,
            Op::BucketApply { name, created_ms } => {
                match created_ms {
                    Some(created_ms) => {
                        // A new bucket (not the start-up publication): drop
                        // what a deletion of one with this name left behind
                        // before it becomes visible (see `store::mpu`).
                        let created =
                            self.started.get() && !self.buckets.borrow().contains_key(&name);
                        if created {
                            self.purge_multipart(&name).await;
                        }
                        self.buckets.borrow_mut().insert(
                            name,
                            BucketView {
                                created_ms,
                                locked: false,
                            },
                        );
                    }
                    None => {
                        self.buckets.borrow_mut().remove(&name);
                        // The deletion is durable: its uploads go with it.
                        self.purge_multipart(&name).await;
                    }
                }
                Reply::Ok
            }
            Op::BucketLock { name } => {
                if let Some(b) = self.buckets.borrow_mut().get_mut(&name) {
                    b.locked = true;
                }
                let writing = self
                    .puts_in_flight
                    .borrow()
                    .get(&name)
                    .copied()
                    .unwrap_or(0);
                Reply::Count(self.store.object_count(&name) + writing)
            }
            Op::Metrics => Reply::Metrics(Box::new(self.metrics_snapshot())),
            Op::Start => {
                // The bucket view is complete: drop the multipart state of
                // buckets whose deletion was cut short by a crash.
                let gone: Vec<String> = self
                    .store
                    .mpu_buckets()
                    .into_iter()
                    .filter(|b| !self.buckets.borrow().contains_key(b))
                    .collect();
                for bucket in gone {
                    self.purge_multipart(&bucket).await;
                }
                self.started.set(true);
                for w in self.start_waiters.borrow_mut().drain(..) {
                    let _ = w.send(());
                }
                Reply::Ok
            }
            Op::BucketUnlock { name } => {
                if let Some(b) = self.buckets.borrow_mut().get_mut(&name) {
                    b.locked = false;
                }
                Reply::Ok
            }
        }
    }
}

/// A write counted against its bucket for DeleteBucket (see `put_started`)
/// until dropped, also when the request's future is dropped half-way.
struct WriteInProgress<'a> {
    shard: &'a Shard,
    bucket: String,
}

impl<'a> WriteInProgress<'a> {
    fn new(shard: &'a Shard, bucket: &str) -> Self {
        shard.put_started(bucket);
        WriteInProgress {
            shard,
            bucket: bucket.to_string(),
        }
    }
}

impl Drop for WriteInProgress<'_> {
    fn drop(&mut self) {
        self.shard.put_ended(&self.bucket);
    }
}

impl Shard {
    /// This shard's counters, gauges and histograms, for a scrape.
    pub fn metrics_snapshot(&self) -> ShardSnapshot {
        use crate::metrics::catalogue::{CrossShardRaw, PoolRaw, RingRaw, SegmentUsage, ShardRaw};
        let (device_write, device_read) = self.store.device_latency();
        let ring = self.ring.borrow().as_ref().map(|ring| RingRaw {
            stats: ring.stats(),
            cq_overflow: ring.cq_overflow(),
            files_registered: ring.files_registered() as u64,
            pool: ring.pool().map(|pool| PoolRaw {
                buffers_in_use: (pool.count() - pool.free_count()) as u64,
                buffer_waits: pool.exhausted_total(),
            }),
        });
        let raw = ShardRaw {
            device_write,
            device_read,
            ring,
            store: self.store.stats(),
            segments: SegmentUsage::from_table(&self.store.segment_table()),
            objects: self.store.objects_total() as u64,
            connections_open: self.metrics.connections_open.get(),
            native_connections_open: self.metrics.native_connections_open.get(),
            requests_in_flight: self.metrics.requests_in_flight.get(),
            cross_shard: CrossShardRaw {
                sessions_open: self.sessions.borrow().len() as u64,
                calls_pending: self.pending.borrow().len() as u64,
                calls_timed_out: self.calls_timed_out.get(),
                orphaned_sessions_closed: self.orphans_closed.get(),
                sessions_expired: self.sessions_expired.get(),
            },
        };
        crate::metrics::catalogue::shard_snapshot(self.id, &self.metrics, &raw)
    }
}

/// A call in flight: its reply slot. Dropped with the call (answered, timed
/// out or cancelled), it removes the slot, and a reply that arrived but was
/// never taken is released (`release_orphan`).
struct PendingCall {
    shard: Rc<Shard>,
    id: u64,
    target: usize,
    rx: oneshot::Receiver<Reply>,
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        self.shard.pending.borrow_mut().remove(&self.id);
        if let Ok(Some(reply)) = self.rx.try_recv() {
            self.shard.release_orphan(self.target, reply);
        }
    }
}

pub fn store_error(e: StoreError) -> ShardError {
    match e {
        StoreError::NotFound => ShardError::NoSuchKey,
        StoreError::NoSpace(e) => ShardError::NoSpace(e.to_string()),
        StoreError::Corrupt { .. } => ShardError::Corrupt(e.to_string()),
        StoreError::ShuttingDown => ShardError::ShuttingDown,
        StoreError::Busy => ShardError::Busy,
        StoreError::Upload(e) => ShardError::Upload(e),
        StoreError::PreconditionFailed => ShardError::PreconditionFailed,
        StoreError::ConditionalConflict => ShardError::ConditionalConflict,
        other => ShardError::Internal(other.to_string()),
    }
}
