//! A shard's MD5 engine: uploads append the bytes they receive to their
//! job, and the engine hashes the queued bytes of every upload together,
//! one upload per lane (`md5::compress_many`), instead of each upload
//! hashing its own bytes one block after another.
//!
//! A run is triggered by the bytes queued across all uploads reaching
//! `RUN_BYTES` (with many uploads receiving at once, their queues fill
//! together and the lanes stay busy), or by an upload that needs its
//! digest (`finish`), which first lets the other ready tasks run once
//! (so uploads finishing together share a run) and then hashes every
//! queue. No timer and no task: the engine runs inside the calls of the
//! uploads that feed it. A lone upload runs alone, at scalar speed.
//!
//! Queued bytes are owned (`Bytes`): an upload dropped with bytes queued
//! leaves nothing dangling (they are hashed with the next run and
//! forgotten). Memory held is bounded by `RUN_BYTES` plus one append.
//! Owned by one shard: no locks.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use bytes::Bytes;

use super::md5::{self, Job, Md5Stream};

/// Queued bytes (all uploads) that trigger a run: sixteen lanes of
/// 128 KiB.
const RUN_BYTES: usize = 16 * 128 * 1024;
/// An append this short to an upload with nothing queued is hashed at
/// once (queuing it would cost more than it saves).
const INLINE_BYTES: usize = 4 * 1024;

struct Queued {
    /// The state lags behind while `queue` holds bytes.
    md5: RefCell<Md5Stream>,
    /// Whole blocks not yet hashed, in order.
    queue: RefCell<Vec<Bytes>>,
    /// In the engine's list of queues to hash.
    listed: Cell<bool>,
}

/// One upload's MD5 (see `Md5Engine::append`, `Md5Engine::finish`).
/// Dropped unfinished (an upload or copy given up), its queued bytes are
/// dropped at once: they are slices of the buffers they were read into,
/// which they would otherwise hold until the engine's next run.
pub struct Md5Job {
    queued: Rc<Queued>,
    engine: std::rc::Weak<Md5Engine>,
}

impl Drop for Md5Job {
    fn drop(&mut self) {
        if let Some(engine) = self.engine.upgrade() {
            engine.forget(&self.queued);
        }
    }
}

/// Counters for /metrics and benchmarks.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Md5EngineStats {
    /// Runs, and upload queues they hashed (queues / runs: the mean lanes
    /// busy).
    pub runs: u64,
    pub jobs: u64,
    /// Bytes hashed in lanes, and one stream at a time (short appends, a
    /// queue alone in its run, CPUs without the lanes).
    pub lane_bytes: u64,
    pub scalar_bytes: u64,
}

pub struct Md5Engine {
    pending: RefCell<Vec<Rc<Queued>>>,
    pending_bytes: Cell<usize>,
    stats: Cell<Md5EngineStats>,
}

impl Md5Engine {
    pub fn new() -> Rc<Md5Engine> {
        Rc::new(Md5Engine {
            pending: RefCell::new(Vec::new()),
            pending_bytes: Cell::new(0),
            stats: Cell::new(Md5EngineStats::default()),
        })
    }

    pub fn stats(&self) -> Md5EngineStats {
        self.stats.get()
    }

    /// A new upload's MD5.
    pub fn job(self: &Rc<Self>) -> Md5Job {
        Md5Job {
            queued: Rc::new(Queued {
                md5: RefCell::new(Md5Stream::new()),
                queue: RefCell::new(Vec::new()),
                listed: Cell::new(false),
            }),
            engine: Rc::downgrade(self),
        }
    }

    /// A job dropped: its queued bytes go now, and it leaves the run list.
    fn forget(&self, q: &Rc<Queued>) {
        let dropped: usize = q.queue.borrow_mut().drain(..).map(|b| b.len()).sum();
        self.pending_bytes
            .set(self.pending_bytes.get().saturating_sub(dropped));
        if q.listed.replace(false) {
            self.pending.borrow_mut().retain(|p| !Rc::ptr_eq(p, q));
        }
    }

    /// Adds the upload's next bytes.
    pub fn append(&self, job: &Md5Job, data: &Bytes) {
        let q = &job.queued;
        let mut queue = q.queue.borrow_mut();
        let mut stream = q.md5.borrow_mut();
        if queue.is_empty() && data.len() < INLINE_BYTES {
            let whole = stream.split(data);
            md5::compress(stream.state_mut(), whole);
            stream.blocks_done(whole.len());
            self.count(|s| s.scalar_bytes += whole.len() as u64);
            return;
        }
        let (completed, whole) = stream.split_deferred(data);
        let mut added = 0;
        if let Some(block) = completed {
            queue.push(Bytes::copy_from_slice(&block));
            added += block.len();
        }
        if !whole.is_empty() {
            let start = whole.as_ptr() as usize - data.as_ptr() as usize;
            queue.push(data.slice(start..start + whole.len()));
            added += whole.len();
        }
        drop((queue, stream));
        if added == 0 {
            return;
        }
        if !q.listed.replace(true) {
            self.pending.borrow_mut().push(q.clone());
        }
        self.pending_bytes.set(self.pending_bytes.get() + added);
        if self.pending_bytes.get() >= RUN_BYTES {
            self.run();
        }
    }

    /// The upload's digest (its bytes are all appended): hashes every
    /// queue first if this one is not empty (it does not wait for other
    /// uploads: a finishing upload takes along whatever the others have
    /// queued by then).
    pub async fn finish(&self, job: &Md5Job) -> [u8; 16] {
        if !job.queued.queue.borrow().is_empty() && md5::lanes_available() {
            // Let the tasks that are ready now run first: uploads and
            // copies that received their bytes meanwhile queue them (and
            // those finishing yield too), so one run hashes them together
            // in lanes instead of each alone, one after another (many
            // small objects arriving at once). The first of them to run
            // again hashes every queue; the others find theirs done.
            futures_lite::future::yield_now().await;
        }
        if !job.queued.queue.borrow().is_empty() {
            self.run();
        }
        debug_assert!(job.queued.queue.borrow().is_empty());
        job.queued.md5.borrow().clone().finish()
    }

    /// Hashes every queue.
    fn run(&self) {
        let jobs = std::mem::take(&mut *self.pending.borrow_mut());
        self.pending_bytes.set(0);
        if jobs.is_empty() {
            return;
        }
        let queues: Vec<Vec<Bytes>> = jobs
            .iter()
            .map(|q| std::mem::take(&mut *q.queue.borrow_mut()))
            .collect();
        let mut states: Vec<[u32; 4]> = jobs
            .iter()
            .map(|q| *q.md5.borrow_mut().state_mut())
            .collect();
        let sizes: Vec<usize> = queues
            .iter()
            .map(|q| q.iter().map(Bytes::len).sum())
            .collect();
        {
            let mut batch: Vec<Job<'_>> = states
                .iter_mut()
                .zip(&queues)
                .map(|(state, queue)| Job {
                    state,
                    slices: queue.iter().map(|b| &b[..]).collect(),
                })
                .collect();
            md5::compress_many(&mut batch);
        }
        for ((q, state), bytes) in jobs.iter().zip(states).zip(&sizes) {
            let mut stream = q.md5.borrow_mut();
            *stream.state_mut() = state;
            stream.blocks_done(*bytes);
            q.listed.set(false);
        }
        let n = jobs.len() as u64;
        let bytes = sizes.iter().sum::<usize>() as u64;
        let lanes = n > 1 && md5::lanes_available();
        self.count(|s| {
            s.runs += 1;
            s.jobs += n;
            if lanes {
                s.lane_bytes += bytes;
            } else {
                s.scalar_bytes += bytes;
            }
        });
    }

    fn count(&self, f: impl FnOnce(&mut Md5EngineStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }
}

#[cfg(test)]
mod tests;
