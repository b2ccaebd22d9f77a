//! The commit path: appends queue records, the flusher packs them into
//! group-commit batches (`start_flush`), writes each batch in pieces of
//! `WRITE_PIECE_BYTES` plus one fdatasync (`write_batch`), and acknowledges
//! batches strictly in order (`batch_durable`); a failed batch is cut off
//! its segment (`cut_failed_batch`) and its waiters get the error.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::oneshot;
use glommio::channels::local_channel::{LocalReceiver, LocalSender};

use super::file::{self, FaultPoint, SegFile, WRITE_ALIGN_BYTES};
use super::record::{self, Kind};
use super::{Loc, Result, Store, StoreError};

/// Records waiting to be written, and the batches being written.
pub(super) struct CommitQueue {
    pub(super) queue: RefCell<VecDeque<Pending>>,
    pub(super) queue_bytes: Cell<u64>,
    /// Wakes the flusher; capacity 1, a full doorbell means "already rung".
    pub(super) doorbell: LocalSender<()>,
    pub(super) doorbell_rx: RefCell<Option<LocalReceiver<()>>>,
    /// Woken when the queue shrinks, for appenders waiting on back-pressure.
    pub(super) space_waiters: RefCell<Vec<oneshot::Sender<()>>>,
    pub(super) flushes_in_flight: Cell<usize>,
    pub(super) flush_waiters: RefCell<Vec<oneshot::Sender<()>>>,
    /// Completion of the last batch started (true: durable).
    pub(super) previous_flush: RefCell<Option<oneshot::Receiver<bool>>>,
}

impl CommitQueue {
    pub(super) fn new() -> CommitQueue {
        let (doorbell, doorbell_rx) = glommio::channels::local_channel::new_bounded(1);
        CommitQueue {
            queue: RefCell::new(VecDeque::new()),
            queue_bytes: Cell::new(0),
            doorbell,
            doorbell_rx: RefCell::new(Some(doorbell_rx)),
            space_waiters: RefCell::new(Vec::new()),
            flushes_in_flight: Cell::new(0),
            flush_waiters: RefCell::new(Vec::new()),
            previous_flush: RefCell::new(None),
        }
    }
}

/// Batches being written at once (pipelined group commit).
pub(super) const FLUSHES_IN_FLIGHT_MAX: usize = 2;

/// Record locations of a batch written at `start`, and the end of its data.
pub(super) fn layout(segment_id: u64, start: u64, batch: &[Pending]) -> (Vec<Loc>, u64) {
    let mut locs = Vec::with_capacity(batch.len());
    let mut end = start;
    for p in batch {
        locs.push(Loc {
            segment_id,
            offset: end,
            header_bytes: p.header.len() as u32,
            payload_bytes: p.payload.len() as u64,
        });
        end += p.span_bytes();
    }
    (locs, end)
}

/// Largest single write of a group-commit batch.
pub(super) const WRITE_PIECE_BYTES: u64 = 1 << 20;

/// Copies `data` to byte `at` of the batch made of consecutive `pieces`.
pub(super) fn copy_into_pieces(pieces: &mut [file::WriteBuf], mut at: u64, mut data: &[u8]) {
    while !data.is_empty() {
        let index = (at / WRITE_PIECE_BYTES) as usize;
        let within = (at % WRITE_PIECE_BYTES) as usize;
        let out = pieces[index].as_mut_slice();
        let take = (out.len() - within).min(data.len());
        out[within..within + take].copy_from_slice(&data[..take]);
        data = &data[take..];
        at += take as u64;
    }
}

/// Buffers for a batch of `len` bytes: pieces of at most
/// `WRITE_PIECE_BYTES`, so that several concurrent writes give the device
/// queue depth. Registered buffers of `ring` when one is free, else plain
/// (aligned) ones.
fn batch_pieces(
    file: &SegFile,
    ring: Option<&crate::ring::DataRing>,
    len: u64,
) -> Vec<file::WriteBuf> {
    let piece_len = |i: u64| (len - i * WRITE_PIECE_BYTES).min(WRITE_PIECE_BYTES) as usize;
    let count = len.div_ceil(WRITE_PIECE_BYTES);
    let mut pieces: Vec<file::WriteBuf> = Vec::with_capacity(count as usize);
    for i in 0..count {
        // Never wait for a registered buffer here: GETs to slow clients
        // may hold them all, and durable writes must not wait on reads.
        let registered = ring.and_then(|r| r.pool().expect("checked").try_acquire());
        pieces.push(match registered {
            Some(buf) => file::WriteBuf::pool(buf, piece_len(i)),
            None => file.alloc_write_buf(piece_len(i)),
        });
    }
    pieces
}

/// Writes consecutive `pieces` from `start` concurrently: registered
/// buffers with WRITE_FIXED on the data ring, others through the file.
async fn write_pieces(
    file: &Rc<SegFile>,
    ring: Option<Rc<crate::ring::DataRing>>,
    start: u64,
    pieces: Vec<file::WriteBuf>,
) -> Result<()> {
    let fd = ring.as_ref().and_then(|r| file.ring_target(r));
    let writes = pieces.into_iter().enumerate().map(|(i, piece)| {
        let (file, ring) = (file.clone(), ring.clone());
        async move {
            let offset = start + i as u64 * WRITE_PIECE_BYTES;
            match (piece, ring, fd) {
                (file::WriteBuf::Pool(buf), Some(ring), Some(fd)) => {
                    let expected = buf.len();
                    let (result, _buf) = ring.write_fixed(fd, buf, offset).await;
                    match result? {
                        n if n == expected => Ok(()),
                        n => Err(io::Error::new(
                            io::ErrorKind::WriteZero,
                            format!("short write: {n} of {expected} bytes"),
                        )),
                    }
                }
                (piece, _, _) => file.write_at(piece, offset).await,
            }
        }
    });
    for result in futures::future::join_all(writes).await {
        result.map_err(StoreError::from_io)?;
    }
    Ok(())
}

/// A record waiting to be written.
pub(super) struct Pending {
    pub(super) header: Vec<u8>,
    pub(super) payload: Bytes,
    pub(super) done: oneshot::Sender<Result<Loc>>,
}

impl Pending {
    pub(super) fn span_bytes(&self) -> u64 {
        record::record_span_bytes(self.header.len() as u64, self.payload.len() as u64)
    }
}

impl Store {
    /// Queues a record; the receiver resolves once it is durable.
    pub(super) async fn append(
        &self,
        header: Vec<u8>,
        payload: Bytes,
    ) -> Result<oneshot::Receiver<Result<Loc>>> {
        // A header whose payload length disagrees with the bytes that follow
        // would make every later record in the segment unreadable.
        if header.len() < record::FIXED_HEADER_BYTES
            || u64::from_le_bytes(header[16..24].try_into().unwrap()) != payload.len() as u64
        {
            return Err(StoreError::Invalid(
                "record payload length does not match its header".into(),
            ));
        }
        let span = record::record_span_bytes(header.len() as u64, payload.len() as u64);
        debug_assert!(
            span <= self
                .inner
                .cfg
                .batch_bytes_max
                .max(self.inner.cfg.chunk_bytes * 2)
        );
        // Back-pressure: wait while the queue is over its bound.
        while self.inner.commit.queue_bytes.get() + span > self.inner.cfg.queue_bytes_max
            && !self.inner.commit.queue.borrow().is_empty()
        {
            if self.inner.shutting_down.get() {
                return Err(StoreError::ShuttingDown);
            }
            let (tx, rx) = oneshot::channel();
            self.inner.commit.space_waiters.borrow_mut().push(tx);
            let _ = rx.await;
        }
        if self.inner.shutting_down.get() {
            return Err(StoreError::ShuttingDown);
        }
        let (done, rx) = oneshot::channel();
        self.inner
            .commit
            .queue_bytes
            .set(self.inner.commit.queue_bytes.get() + span);
        self.inner.commit.queue.borrow_mut().push_back(Pending {
            header,
            payload,
            done,
        });
        let _ = self.inner.commit.doorbell.try_send(());
        Ok(rx)
    }

    pub(super) async fn append_durable(&self, header: Vec<u8>, payload: Bytes) -> Result<Loc> {
        let rx = self.append(header, payload).await?;
        rx.await.map_err(|_| StoreError::ShuttingDown)?
    }

    pub(super) async fn flush_loop(self, rx: glommio::channels::local_channel::LocalReceiver<()>) {
        loop {
            if self.inner.commit.queue.borrow().is_empty() {
                if self.inner.shutting_down.get() {
                    self.wait_flushes_below(1).await;
                    return;
                }
                if rx.recv().await.is_none() {
                    return;
                }
                continue;
            }
            // A second batch goes out while one is in flight only when enough
            // is queued to fill it; otherwise waiting packs more into it
            // (each batch wastes up to 4 KiB of padding).
            if self.inner.commit.queue_bytes.get() < self.inner.cfg.batch_bytes_max / 2 {
                self.wait_flushes_below(1).await;
            } else {
                self.wait_flushes_below(FLUSHES_IN_FLIGHT_MAX).await;
            }
            self.start_flush().await;
        }
    }

    /// Waits until fewer than `n` batches are being written.
    pub(super) async fn wait_flushes_below(&self, n: usize) {
        while self.inner.commit.flushes_in_flight.get() >= n {
            let (tx, rx) = oneshot::channel();
            self.inner.commit.flush_waiters.borrow_mut().push(tx);
            let _ = rx.await;
        }
    }

    /// Takes up to `batch_bytes_max` of queued records that fit in the active
    /// segment, lays them out after the previous batch and starts writing
    /// them (one write per MiB, then one fdatasync). Batches are written
    /// concurrently but acknowledged strictly in order: a batch completes only
    /// after every batch before it in the segment is durable, so recovery
    /// never finds a torn batch in front of an acknowledged one.
    pub(super) async fn start_flush(&self) {
        if let Err(e) = self.ensure_active_segment().await {
            self.fail_queue_front(e);
            return;
        }
        let segment_id = self.inner.segs.active.get().expect("active segment");
        let start = self.inner.segs.write_offset.get();
        debug_assert_eq!(start % WRITE_ALIGN_BYTES, 0);
        let room = self
            .inner
            .cfg
            .segment_bytes_max
            .saturating_sub(start + WRITE_ALIGN_BYTES);
        let mut batch = self.take_batch(room);
        if batch.is_empty() {
            // The next record does not fit: seal and move on.
            self.seal_active().await;
            return;
        }
        let (locs, end) = layout(segment_id, start, &batch);
        let key = self
            .segment_key(segment_id)
            .expect("active segment is open");
        for (p, loc) in batch.iter_mut().zip(&locs) {
            record::bind_header(&mut p.header, &key, loc.offset);
        }
        let len = (end - start).next_multiple_of(WRITE_ALIGN_BYTES);
        self.inner.segs.write_offset.set(start + len);
        let previous = self.inner.commit.previous_flush.borrow_mut().take();
        let (done_tx, done_rx) = oneshot::channel();
        *self.inner.commit.previous_flush.borrow_mut() = Some(done_rx);
        self.inner
            .commit
            .flushes_in_flight
            .set(self.inner.commit.flushes_in_flight.get() + 1);
        let store = self.clone();
        glommio::spawn_local(async move {
            let written = store
                .write_batch(segment_id, start, len, &batch, &locs)
                .await;
            let previous_ok = match previous {
                Some(rx) => rx.await.unwrap_or(false),
                None => true,
            };
            let ok = written.is_ok() && previous_ok;
            if ok {
                store.batch_durable(segment_id, end, len, batch, locs);
            } else {
                store.cut_failed_batch(segment_id, start, &batch).await;
                let e = written.err().unwrap_or_else(|| {
                    StoreError::Io(io::Error::other("an earlier write of this segment failed"))
                });
                store.batch_failed(segment_id, e, batch);
            }
            let _ = done_tx.send(ok);
            store
                .inner
                .commit
                .flushes_in_flight
                .set(store.inner.commit.flushes_in_flight.get() - 1);
            for w in store.inner.commit.flush_waiters.borrow_mut().drain(..) {
                let _ = w.send(());
            }
        })
        .detach();
    }

    pub(super) fn batch_durable(
        &self,
        segment_id: u64,
        end: u64,
        len: u64,
        batch: Vec<Pending>,
        locs: Vec<Loc>,
    ) {
        if let Some(seg) = self.inner.segs.table.borrow_mut().get_mut(&segment_id) {
            seg.end_bytes = seg.end_bytes.max(end);
        }
        {
            let mut stats = self.inner.stats.borrow_mut();
            stats.flushes += 1;
            stats.records_written += batch.len() as u64;
            stats.bytes_written += len;
        }
        for (p, loc) in batch.into_iter().zip(locs) {
            let _ = p.done.send(Ok(loc));
        }
    }

    /// A failed batch may still have reached the file whole (the fsync
    /// failed, or a later batch's write landed while an earlier one failed).
    /// Its records were never acknowledged, but recovery would find them and
    /// let one win over what was acknowledged later: a DELETE of a key that
    /// looked absent writes no tombstone. So the batch is cut off the
    /// abandoned segment (each failed batch cuts at its own start, after its
    /// own write finished; batches fail in order, so the file ends up cut at
    /// the first failed batch, later space reading as zero padding). Found by
    /// the fault-injection model test (server/tests/faults.rs).
    pub(super) async fn cut_failed_batch(&self, segment_id: u64, start: u64, batch: &[Pending]) {
        let Some(file) = self.segment_file(segment_id) else {
            return;
        };
        let cut = async {
            self.fault(FaultPoint::Write {
                segment_id,
                offset: start,
                len_bytes: 0,
            })?;
            file.truncate(start).await?;
            file.sync().await
        }
        .await;
        if let Err(e) = cut {
            tracing::error!(
                shard = self.inner.cfg.shard_id,
                segment_id,
                start,
                "cannot cut a failed batch off its segment ({e}); its keys keep tombstones until restart"
            );
            let mut uncertain = self.inner.marks.uncertain.borrow_mut();
            for p in batch {
                if let Ok((h, _)) = record::parse_header(&p.header) {
                    if matches!(
                        h.kind(),
                        Kind::Object | Kind::Tombstone | Kind::DeleteMarker
                    ) {
                        uncertain.insert((h.bucket, h.key));
                    }
                }
            }
        }
    }

    pub(crate) fn is_uncertain(&self, bucket: &str, key: &str) -> bool {
        let u = self.inner.marks.uncertain.borrow();
        !u.is_empty() && u.contains(&(bucket.to_string(), key.to_string()))
    }

    pub(super) fn batch_failed(&self, segment_id: u64, e: StoreError, batch: Vec<Pending>) {
        self.inner.stats.borrow_mut().write_errors += 1;
        tracing::error!(
            shard = self.inner.cfg.shard_id,
            segment_id,
            "write failed: {e}"
        );
        // Abandon this segment: later writes go to a fresh one, so a partial
        // write never sits in front of acknowledged data.
        if self.inner.segs.active.get() == Some(segment_id) {
            self.inner.segs.active.set(None);
        }
        for p in batch {
            let _ = p.done.send(Err(e.clone_for_waiter()));
        }
    }

    pub(super) fn take_batch(&self, room_bytes: u64) -> Vec<Pending> {
        let mut queue = self.inner.commit.queue.borrow_mut();
        let mut batch = Vec::new();
        let mut bytes = 0u64;
        while let Some(p) = queue.front() {
            let span = p.span_bytes();
            if bytes + span > room_bytes
                || (bytes > 0 && bytes + span > self.inner.cfg.batch_bytes_max)
            {
                break;
            }
            bytes += span;
            batch.push(queue.pop_front().unwrap());
        }
        drop(queue);
        self.inner
            .commit
            .queue_bytes
            .set(self.inner.commit.queue_bytes.get() - bytes);
        for w in self.inner.commit.space_waiters.borrow_mut().drain(..) {
            let _ = w.send(());
        }
        batch
    }

    pub(super) fn fail_queue_front(&self, e: StoreError) {
        let batch = self.take_batch(u64::MAX);
        self.inner.stats.borrow_mut().write_errors += 1;
        for p in batch {
            let _ = p.done.send(Err(e.clone_for_waiter()));
        }
    }

    /// Writes one laid-out batch and makes it durable.
    pub(super) async fn write_batch(
        &self,
        segment_id: u64,
        start: u64,
        len: u64,
        batch: &[Pending],
        locs: &[Loc],
    ) -> Result<()> {
        let started = std::time::Instant::now();
        let result = self
            .write_batch_inner(segment_id, start, len, batch, locs)
            .await;
        self.inner.device_write.record(started.elapsed());
        result
    }

    /// Fills the batch's pieces, writes them concurrently (faults
    /// injected), then makes them durable with one fdatasync.
    pub(super) async fn write_batch_inner(
        &self,
        segment_id: u64,
        start: u64,
        len: u64,
        batch: &[Pending],
        locs: &[Loc],
    ) -> Result<()> {
        let file = self
            .segment_file(segment_id)
            .expect("segment with batches in flight is open");
        let ring = self.inner.ring.borrow().clone().filter(|r| {
            file.direct_fd().is_some()
                && r.pool()
                    .is_some_and(|p| p.buf_bytes() as u64 >= WRITE_PIECE_BYTES)
        });
        let mut pieces = batch_pieces(&file, ring.as_deref(), len);
        for (p, loc) in batch.iter().zip(locs) {
            let at = loc.offset - start;
            copy_into_pieces(&mut pieces, at, &p.header);
            copy_into_pieces(&mut pieces, at + p.header.len() as u64, &p.payload);
        }
        let torn = self.inject_write_fault(segment_id, start, len, &mut pieces)?;
        write_pieces(&file, ring, start, pieces).await?;
        if let Some(t) = torn {
            let kind = if t.short {
                io::ErrorKind::WriteZero
            } else {
                io::ErrorKind::Other
            };
            return Err(StoreError::from_io(io::Error::new(
                kind,
                format!("{t}: EIO"),
            )));
        }
        self.fault(FaultPoint::Sync { segment_id })
            .map_err(StoreError::from_io)?;
        file.sync().await.map_err(StoreError::from_io)?;
        Ok(())
    }

    /// The write fault point of a batch. A torn write goes to the file
    /// (damaged) and then fails; a short one stops early, leaving nothing
    /// beyond its end: `pieces` are changed to what reaches the file, and
    /// the fault is returned to fail the batch once they are written. Any
    /// other injected error fails the batch before anything is written.
    fn inject_write_fault(
        &self,
        segment_id: u64,
        start: u64,
        len: u64,
        pieces: &mut Vec<file::WriteBuf>,
    ) -> Result<Option<file::TornWrite>> {
        let Err(e) = self.fault(FaultPoint::Write {
            segment_id,
            offset: start,
            len_bytes: len,
        }) else {
            return Ok(None);
        };
        let t = file::TornWrite::of(&e).ok_or_else(|| StoreError::from_io(e))?;
        let fill = if t.garbage { 0xA5 } else { 0 };
        let keep_bytes = if t.short {
            t.bytes / WRITE_ALIGN_BYTES * WRITE_ALIGN_BYTES
        } else {
            t.bytes
        };
        for (i, piece) in pieces.iter_mut().enumerate() {
            let piece_start = i as u64 * WRITE_PIECE_BYTES;
            let keep = keep_bytes.saturating_sub(piece_start) as usize;
            if t.short {
                piece.truncate(keep);
                continue;
            }
            let out = piece.as_mut_slice();
            if keep < out.len() {
                out[keep..].fill(fill);
            }
        }
        if t.short {
            pieces.retain_mut(|p| !p.as_mut_slice().is_empty());
        }
        Ok(Some(t))
    }

    /// Flushes everything queued and stops the background tasks.
    pub async fn shutdown(&self) {
        while !self.inner.commit.queue.borrow().is_empty() {
            let _ = self.inner.commit.doorbell.try_send(());
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        self.inner.shutting_down.set(true);
        let _ = self.inner.commit.doorbell.try_send(());
        // A sealed segment needs no payload verification at the next start.
        self.seal_active().await;
    }
}
