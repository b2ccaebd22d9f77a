//! Messaging between shards: the mesh of bounded channels, the receive loop
//! that runs requests from peers and routes replies back to their callers,
//! and `Shard::call`, the one way to run an `Op` on another shard (bounded
//! wait, orphaned sessions released).

use std::rc::Rc;
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use glommio::channels::shared_channel::{ConnectedReceiver, SharedReceiver, SharedSender};

use super::msg::{Msg, Op, Reply, ShardError};
use super::{Shard, CHANNEL_CAPACITY};
use crate::metrics::Stage;

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

impl Shard {
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
                | Op::BucketConfigApply { .. }
                | Op::UserApply { .. }
                | Op::BucketUnlock { .. }
                | Op::BucketReopen { .. }
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
