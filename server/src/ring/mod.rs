//! The per-shard data ring: an io_uring of our own beside glommio's, for
//! what glommio cannot do (registered-buffer reads, SEND_ZC, SQPOLL).
//!
//! - Single issuer: only the shard's thread touches it.
//! - Its completions are announced on an eventfd registered with the ring; a
//!   reaper task on the shard's glommio executor drains the completion queue,
//!   and parks on the eventfd (through glommio) only when nothing is ready.
//! - Submissions are queued and pushed to the kernel in batches, on the next
//!   reaper turn or when `submit_batch_max` are waiting.
//! - A buffer given to an operation comes back only with its last completion:
//!   for SEND_ZC that is the notification CQE, after which the kernel no
//!   longer reads the pages.
//! - Sends are counted honestly: zero-copy, copied by the kernel (reported
//!   through IORING_SEND_ZC_REPORT_USAGE; always the case on loopback), plain.
//!
//! DEFER_TASKRUN is not used: with it the kernel posts completions (and
//! signals the eventfd) only when the issuer enters the ring, which a parked
//! executor never does.

pub mod pool;

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

pub use pool::{BufferPool, PoolBuf};

/// Not exported by the io-uring crate's public API.
const IORING_SEND_ZC_REPORT_USAGE: u16 = 8;
const IORING_NOTIF_USAGE_ZC_COPIED: i32 = i32::MIN; // 1 << 31

#[derive(Debug, Clone)]
pub struct RingConfig {
    pub entries: u32,
    /// SQPOLL idle time; None: no SQPOLL (the default on small machines).
    pub sqpoll_idle_ms: Option<u32>,
    pub sqpoll_cpu: Option<u32>,
    /// Submit once this many SQEs are queued, even mid-turn.
    pub submit_batch_max: usize,
    /// Sends at least this large use SEND_ZC.
    pub send_zc_min_bytes: usize,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            entries: 256,
            sqpoll_idle_ms: None,
            sqpoll_cpu: None,
            submit_batch_max: 64,
            send_zc_min_bytes: 16 * 1024,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct RingStats {
    pub submitted: u64,
    pub submit_calls: u64,
    pub completions: u64,
    pub sq_full: u64,
    pub reads_fixed: u64,
    pub writes_fixed: u64,
    pub sends_zero_copy: u64,
    pub sends_copied: u64,
    pub sends_plain: u64,
    /// Plain sends (counted in `sends_plain` too) of sizes that would use
    /// SEND_ZC, on sockets whose SEND_ZC the kernel had already copied.
    pub sends_zc_declined: u64,
    pub send_zc_unsupported: u64,
    pub eventfd_waits: u64,
}

#[derive(Default)]
struct Slot {
    result: Option<i32>,
    /// SEND_ZC: the first CQE said a notification will follow.
    awaiting_notif: bool,
    notif_copied: Option<bool>,
    done: bool,
    /// The future was dropped: free the slot at completion.
    orphaned: bool,
    waker: Option<Waker>,
    /// Held until the last completion.
    buf: Option<PoolBuf>,
    timespec: Option<Box<types::Timespec>>,
}

pub struct DataRing {
    ring: RefCell<IoUring>,
    slots: RefCell<Vec<Option<Slot>>>,
    free_slots: RefCell<Vec<usize>>,
    queued: RefCell<Vec<squeue::Entry>>,
    in_flight: Cell<usize>,
    efd: RawFd,
    cfg: RingConfig,
    stats: RefCell<RingStats>,
    zc_supported: Cell<bool>,
    reaper_waker: RefCell<Option<Waker>>,
    submit_scheduled: Cell<bool>,
    me: std::rc::Weak<DataRing>,
    pool: Option<BufferPool>,
    /// Free registered-file slots; empty if the kernel refused the table.
    free_file_slots: RefCell<Vec<u32>>,
}

impl Drop for DataRing {
    fn drop(&mut self) {
        // SAFETY: `efd` is the eventfd this ring created and owns; nothing
        // else closes it (the reaper works on its own dup).
        unsafe { libc::close(self.efd) };
    }
}

/// Slots of the registered-file table (sparse; segments register lazily).
const FILE_SLOTS: u32 = 4096;

/// How an operation names its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileRef {
    Raw(RawFd),
    /// A slot of the ring's registered-file table (no fget per I/O).
    Fixed(u32),
}

impl From<RawFd> for FileRef {
    fn from(fd: RawFd) -> FileRef {
        FileRef::Raw(fd)
    }
}

/// Result of a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendKind {
    ZeroCopy,
    /// SEND_ZC, but the kernel reported that it copied (loopback, veth, ...).
    Copied,
    Plain,
}

impl DataRing {
    /// Creates the ring on the calling shard thread, registers the pool's
    /// buffers and the eventfd, and starts the reaper task.
    pub fn new(cfg: RingConfig, pool: Option<BufferPool>) -> io::Result<Rc<DataRing>> {
        let mut builder = IoUring::builder();
        builder.setup_single_issuer();
        if cfg.sqpoll_idle_ms.is_none() {
            // The kernel refuses COOP_TASKRUN together with SQPOLL.
            builder.setup_coop_taskrun();
        }
        if let Some(idle) = cfg.sqpoll_idle_ms {
            builder.setup_sqpoll(idle);
            if let Some(cpu) = cfg.sqpoll_cpu {
                builder.setup_sqpoll_cpu(cpu);
            }
        }
        let ring = builder.build(cfg.entries)?;
        // SAFETY: eventfd takes no pointers; the result is checked below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        ring.submitter().register_eventfd(efd)?;
        if let Some(pool) = &pool {
            // SAFETY: the iovecs describe the pool's one live mapping. The
            // ring keeps the pool (`DataRing::pool`), so the mapping outlives
            // the registration, and a buffer is only handed to the kernel
            // while a `PoolBuf` loan for it is held by the op's slot.
            unsafe { ring.submitter().register_buffers(&pool.iovecs())? };
        }
        let free_file_slots = match ring.submitter().register_files_sparse(FILE_SLOTS) {
            Ok(()) => (0..FILE_SLOTS).rev().collect(),
            Err(_) => Vec::new(),
        };
        let ring = Rc::new_cyclic(|me| DataRing {
            ring: RefCell::new(ring),
            slots: RefCell::new(Vec::new()),
            free_slots: RefCell::new(Vec::new()),
            queued: RefCell::new(Vec::new()),
            in_flight: Cell::new(0),
            efd,
            cfg,
            stats: RefCell::new(RingStats::default()),
            zc_supported: Cell::new(true),
            reaper_waker: RefCell::new(None),
            submit_scheduled: Cell::new(false),
            me: me.clone(),
            pool,
            free_file_slots: RefCell::new(free_file_slots),
        });
        let weak = Rc::downgrade(&ring);
        glommio::spawn_local(async move { reaper(weak).await }).detach();
        Ok(ring)
    }

    pub fn weak(&self) -> std::rc::Weak<DataRing> {
        self.me.clone()
    }

    /// Registers `fd` in a free slot of the file table.
    pub fn register_file(&self, fd: RawFd) -> Option<u32> {
        let slot = self.free_file_slots.borrow_mut().pop()?;
        let done = self
            .ring
            .borrow()
            .submitter()
            .register_files_update(slot, &[fd]);
        match done {
            Ok(_) => Some(slot),
            Err(_) => {
                self.free_file_slots.borrow_mut().push(slot);
                None
            }
        }
    }

    /// Completions the kernel dropped because the CQ was full (the ring is
    /// sized so that this stays 0; nonzero means lost wakeups).
    pub fn cq_overflow(&self) -> u64 {
        u64::from(self.ring.borrow_mut().completion().overflow())
    }

    /// Files in the registered-file table now.
    pub fn files_registered(&self) -> usize {
        let free = self.free_file_slots.borrow().len();
        if free == 0
            && self
                .ring
                .borrow()
                .submitter()
                .register_files_update(0, &[])
                .is_err()
        {
            return 0;
        }
        FILE_SLOTS as usize - free
    }

    /// Empties a slot (the table drops its reference to the file).
    pub fn unregister_file(&self, slot: u32) {
        let done = self
            .ring
            .borrow()
            .submitter()
            .register_files_update(slot, &[-1]);
        if done.is_ok() {
            self.free_file_slots.borrow_mut().push(slot);
        }
    }

    pub fn stats(&self) -> RingStats {
        self.stats.borrow().clone()
    }

    pub fn pool(&self) -> Option<&BufferPool> {
        self.pool.as_ref()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.get()
    }

    fn new_slot(&self, buf: Option<PoolBuf>, timespec: Option<Box<types::Timespec>>) -> usize {
        let slot = Slot {
            buf,
            timespec,
            ..Default::default()
        };
        let mut slots = self.slots.borrow_mut();
        match self.free_slots.borrow_mut().pop() {
            Some(i) => {
                debug_assert!(slots[i].is_none());
                slots[i] = Some(slot);
                i
            }
            None => {
                slots.push(Some(slot));
                slots.len() - 1
            }
        }
    }

    fn queue(&self, entry: squeue::Entry, slot: usize) -> OpFuture<'_> {
        self.queued.borrow_mut().push(entry.user_data(slot as u64));
        self.in_flight.set(self.in_flight.get() + 1);
        if self.queued.borrow().len() >= self.cfg.submit_batch_max {
            self.submit_queued();
        } else if !self.submit_scheduled.replace(true) {
            // Submit everything queued during this scheduler turn at once.
            // (glommio polls a new task right away: yield first.)
            let me = self.me.clone();
            glommio::spawn_local(async move {
                futures_lite::future::yield_now().await;
                if let Some(r) = me.upgrade() {
                    r.submit_scheduled.set(false);
                    r.submit_queued();
                }
            })
            .detach();
        }
        if let Some(w) = self.reaper_waker.borrow_mut().take() {
            w.wake();
        }
        OpFuture { ring: self, slot }
    }

    /// Moves queued SQEs into the submission queue and submits them.
    fn submit_queued(&self) {
        let mut queued = self.queued.borrow_mut();
        if queued.is_empty() {
            return;
        }
        let mut ring = self.ring.borrow_mut();
        let mut pushed = 0;
        while pushed < queued.len() {
            let full = {
                let mut sq = ring.submission();
                let mut n = 0;
                for e in &queued[pushed..] {
                    // SAFETY: every queued SQE's memory (pool buffer,
                    // timespec) is held by its slot until its last
                    // completion, even if the future is dropped (`orphaned`).
                    if unsafe { sq.push(e) }.is_err() {
                        break;
                    }
                    n += 1;
                }
                pushed += n;
                pushed < queued.len()
            };
            let mut stats = self.stats.borrow_mut();
            stats.submit_calls += 1;
            if full {
                stats.sq_full += 1;
            }
            drop(stats);
            if let Err(e) = ring.submit() {
                // EBUSY/EAGAIN: the CQ is backed up; completions drain it.
                tracing::warn!("data ring submit: {e}");
                break;
            }
        }
        self.stats.borrow_mut().submitted += pushed as u64;
        queued.drain(..pushed);
    }

    /// Drains the completion queue; returns completions handled.
    fn reap(&self) -> usize {
        let mut ring = self.ring.borrow_mut();
        let mut handled = 0;
        let cq = ring.completion();
        for cqe in cq {
            handled += 1;
            self.complete(cqe.user_data() as usize, cqe.result(), cqe.flags());
        }
        self.stats.borrow_mut().completions += handled as u64;
        handled
    }

    fn complete(&self, index: usize, result: i32, flags: u32) {
        let mut slots = self.slots.borrow_mut();
        let Some(slot) = slots.get_mut(index).and_then(Option::as_mut) else {
            debug_assert!(false, "completion for unknown slot {index}");
            return;
        };
        if cqueue::notif(flags) {
            debug_assert!(slot.awaiting_notif);
            slot.notif_copied = Some(result & IORING_NOTIF_USAGE_ZC_COPIED != 0);
            slot.awaiting_notif = false;
        } else {
            slot.result = Some(result);
            slot.awaiting_notif = cqueue::more(flags);
        }
        if slot.awaiting_notif {
            return; // the buffer stays with the kernel
        }
        slot.done = true;
        self.in_flight.set(self.in_flight.get() - 1);
        if slot.orphaned {
            slots[index] = None;
            drop(slots);
            self.free_slots.borrow_mut().push(index);
        } else if let Some(w) = slot.waker.take() {
            w.wake();
        }
    }

    /// Reads `len_bytes` at `offset` of `fd` into a registered buffer.
    pub async fn read_fixed(
        &self,
        file: impl Into<FileRef>,
        mut buf: PoolBuf,
        offset: u64,
        len_bytes: usize,
    ) -> (io::Result<usize>, PoolBuf) {
        assert!(len_bytes <= buf.capacity());
        let (ptr, index) = (buf.as_mut_ptr(), buf.index());
        let len = len_bytes as u32;
        let entry = match file.into() {
            FileRef::Raw(fd) => opcode::ReadFixed::new(types::Fd(fd), ptr, len, index)
                .offset(offset)
                .build(),
            FileRef::Fixed(slot) => opcode::ReadFixed::new(types::Fixed(slot), ptr, len, index)
                .offset(offset)
                .build(),
        };
        let slot = self.new_slot(Some(buf), None);
        self.stats.borrow_mut().reads_fixed += 1;
        let (result, buf, _) = self.queue(entry, slot).await;
        let mut buf = buf.expect("buffer comes back");
        let result = if result < 0 {
            Err(io::Error::from_raw_os_error(-result))
        } else {
            Ok(result as usize)
        };
        if let Ok(n) = result {
            buf.set_len(n);
        }
        (result, buf)
    }

    /// Writes `buf[..len]` at `offset` of `fd` from a registered buffer.
    pub async fn write_fixed(
        &self,
        file: impl Into<FileRef>,
        buf: PoolBuf,
        offset: u64,
    ) -> (io::Result<usize>, PoolBuf) {
        let len = buf.len() as u32;
        let (ptr, index) = (buf.as_ptr(), buf.index());
        let entry = match file.into() {
            FileRef::Raw(fd) => opcode::WriteFixed::new(types::Fd(fd), ptr, len, index)
                .offset(offset)
                .build(),
            FileRef::Fixed(slot) => opcode::WriteFixed::new(types::Fixed(slot), ptr, len, index)
                .offset(offset)
                .build(),
        };
        let slot = self.new_slot(Some(buf), None);
        self.stats.borrow_mut().writes_fixed += 1;
        let (result, buf, _) = self.queue(entry, slot).await;
        let buf = buf.expect("buffer comes back");
        if result < 0 {
            (Err(io::Error::from_raw_os_error(-result)), buf)
        } else {
            (Ok(result as usize), buf)
        }
    }

    /// Sends `buf[start..end]` on socket `fd`: SEND_ZC from the registered
    /// buffer at or above the size threshold (falling back to a plain send
    /// where the kernel refuses), a plain send below it. Resolves after the
    /// kernel is done with the buffer.
    ///
    /// `zc_allowed` is the caller's per-socket verdict: a caller that got
    /// `SendKind::Copied` back should pass false from then on. A SEND_ZC the
    /// kernel copies (loopback, veth, a device without scatter-gather) costs
    /// more than a plain send and holds the buffer until the peer has read
    /// the data, which on loopback stalled 1 MiB replies for tens of ms.
    pub async fn send(
        &self,
        fd: RawFd,
        buf: PoolBuf,
        start: usize,
        end: usize,
        zc_allowed: bool,
    ) -> (io::Result<(usize, SendKind)>, PoolBuf) {
        assert!(start <= end && end <= buf.len());
        let wants_zc = end - start >= self.cfg.send_zc_min_bytes && self.zc_supported.get();
        let zc = wants_zc && zc_allowed;
        // SAFETY: `start <= buf.len() <= capacity` (asserted above), so the
        // pointer stays inside this buffer of the pool's mapping.
        let ptr = unsafe { buf.as_ptr().add(start) };
        let len = (end - start) as u32;
        let entry = if zc {
            opcode::SendZc::new(types::Fd(fd), ptr, len)
                .buf_index(Some(buf.index()))
                .flags(libc::MSG_NOSIGNAL)
                .zc_flags(IORING_SEND_ZC_REPORT_USAGE)
                .build()
        } else {
            opcode::Send::new(types::Fd(fd), ptr, len)
                .flags(libc::MSG_NOSIGNAL)
                .build()
        };
        let slot = self.new_slot(Some(buf), None);
        let (result, buf, copied) = self.queue(entry, slot).await;
        let buf = buf.expect("buffer comes back");
        if result == -libc::EOPNOTSUPP && zc {
            self.zc_supported.set(false);
            self.stats.borrow_mut().send_zc_unsupported += 1;
            return Box::pin(self.send(fd, buf, start, end, zc_allowed)).await;
        }
        if result < 0 {
            return (Err(io::Error::from_raw_os_error(-result)), buf);
        }
        let kind = match (zc, copied) {
            (false, _) => SendKind::Plain,
            (true, Some(true)) => SendKind::Copied,
            (true, _) => SendKind::ZeroCopy,
        };
        let mut stats = self.stats.borrow_mut();
        match kind {
            SendKind::ZeroCopy => stats.sends_zero_copy += 1,
            SendKind::Copied => stats.sends_copied += 1,
            SendKind::Plain => stats.sends_plain += 1,
        }
        if wants_zc && !zc {
            stats.sends_zc_declined += 1;
        }
        (Ok((result as usize, kind)), buf)
    }

    /// A ring timeout; completes with -ETIME. Used to prove that ring
    /// completions wake a parked executor.
    pub async fn timeout(&self, after: Duration) -> i32 {
        let ts = Box::new(
            types::Timespec::new()
                .sec(after.as_secs())
                .nsec(after.subsec_nanos()),
        );
        let entry = opcode::Timeout::new(&*ts as *const types::Timespec).build();
        let slot = self.new_slot(None, Some(ts));
        self.queue(entry, slot).await.0
    }

    pub async fn nop(&self) -> i32 {
        let slot = self.new_slot(None, None);
        self.queue(opcode::Nop::new().build(), slot).await.0
    }
}

/// Completes when the operation's last CQE arrived.
struct OpFuture<'a> {
    ring: &'a DataRing,
    slot: usize,
}

impl Future for OpFuture<'_> {
    type Output = (i32, Option<PoolBuf>, Option<bool>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slots = self.ring.slots.borrow_mut();
        let slot = slots[self.slot].as_mut().expect("live slot");
        if !slot.done {
            slot.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let slot = slots[self.slot].take().expect("live slot");
        drop(slots);
        self.ring.free_slots.borrow_mut().push(self.slot);
        let _ = slot.timespec;
        Poll::Ready((
            slot.result.unwrap_or(-libc::ECANCELED),
            slot.buf,
            slot.notif_copied,
        ))
    }
}

impl Drop for OpFuture<'_> {
    fn drop(&mut self) {
        let mut slots = self.ring.slots.borrow_mut();
        if let Some(Some(slot)) = slots.get_mut(self.slot) {
            if !slot.done {
                // The kernel still owns the buffer: keep it until completion.
                slot.orphaned = true;
            }
        }
    }
}

/// Submits queued work and drains completions on every turn; parks on the
/// eventfd only when operations are in flight and nothing is ready.
async fn reaper(ring: std::rc::Weak<DataRing>) {
    let efd = match ring.upgrade() {
        // SAFETY: `r.efd` is open while `r` (the ring) is alive; dup takes
        // no pointers and its result is owned by the file below.
        Some(r) => unsafe { libc::dup(r.efd) },
        None => return,
    };
    // SAFETY: `efd` is a fresh dup that nothing else owns or closes.
    let eventfd = unsafe { glommio::io::BufferedFile::from_raw_fd(efd) };
    loop {
        let Some(r) = ring.upgrade() else { break };
        r.submit_queued();
        if r.reap() > 0 {
            drop(r);
            glommio::yield_if_needed().await;
            continue;
        }
        if r.in_flight.get() == 0 && r.queued.borrow().is_empty() {
            // Idle: wait for the next queued operation.
            std::future::poll_fn(|cx| {
                if r.in_flight.get() > 0 || !r.queued.borrow().is_empty() {
                    Poll::Ready(())
                } else {
                    *r.reaper_waker.borrow_mut() = Some(cx.waker().clone());
                    Poll::Pending
                }
            })
            .await;
            continue;
        }
        r.stats.borrow_mut().eventfd_waits += 1;
        drop(r);
        // Reading resets the counter; a completion that raced ahead of this
        // read has already bumped it, so the read returns at once.
        let _ = eventfd.read_at(0, 8).await;
    }
    let _ = eventfd.close().await;
}
