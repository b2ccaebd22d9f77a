//! A shard's registered buffer pool: one mapping, allocated after pinning,
//! 2 MiB huge pages where the kernel has them, cut into equal buffers that are
//! registered with the shard's data ring. Bounded: when every buffer is out,
//! `try_acquire` says so and `acquire` waits.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;

use futures::channel::oneshot;

pub struct PoolInner {
    base: *mut u8,
    map_bytes: usize,
    buf_bytes: usize,
    count: usize,
    huge_pages: bool,
    free: RefCell<Vec<u16>>,
    waiters: RefCell<VecDeque<oneshot::Sender<()>>>,
    acquired_total: Cell<u64>,
    exhausted_total: Cell<u64>,
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // SAFETY: `base`/`map_bytes` are the mapping `map` made; the last
        // `Rc<PoolInner>` is going (every `PoolBuf` holds one), so no buffer
        // of it is on loan or registered with a live ring.
        unsafe { libc::munmap(self.base.cast(), self.map_bytes) };
    }
}

/// A buffer on loan from the pool; it goes back when dropped. While an I/O
/// uses it the ring holds it, so it cannot return early.
pub struct PoolBuf {
    pool: Rc<PoolInner>,
    index: u16,
    len: usize,
}

impl PoolBuf {
    pub fn index(&self) -> u16 {
        self.index
    }
    /// Bytes in use (set by the last read, or by `set_len`).
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn capacity(&self) -> usize {
        self.pool.buf_bytes
    }
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity());
        self.len = len;
    }
    pub fn as_ptr(&self) -> *const u8 {
        // SAFETY: `index < count`, so the offset is inside the mapping.
        unsafe {
            self.pool
                .base
                .add(self.index as usize * self.pool.buf_bytes)
        }
    }
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: `index < count`, so the offset is inside the mapping.
        unsafe {
            self.pool
                .base
                .add(self.index as usize * self.pool.buf_bytes)
        }
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len <= capacity` (`set_len` asserts it); this loan owns
        // the buffer exclusively, and the mapping lives while `pool` does.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }
    /// The whole capacity, for filling.
    pub fn as_mut_capacity(&mut self) -> &mut [u8] {
        let cap = self.capacity();
        // SAFETY: the buffer's whole capacity is inside the mapping and only
        // this loan (borrowed mutably here) may touch it.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), cap) }
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        self.pool.free.borrow_mut().push(self.index);
        if let Some(w) = self.pool.waiters.borrow_mut().pop_front() {
            let _ = w.send(());
        }
    }
}

#[derive(Clone)]
pub struct BufferPool {
    inner: Rc<PoolInner>,
}

/// Registered buffers per ring are limited to 16384 by the kernel.
pub const POOL_BUFFERS_MAX: usize = 16384;
const HUGE_PAGE_BYTES: usize = 2 << 20;

impl BufferPool {
    /// Maps `count` buffers of `buf_bytes` (a multiple of 4096).
    pub fn new(buf_bytes: usize, count: usize) -> io::Result<BufferPool> {
        assert!(
            buf_bytes > 0 && buf_bytes.is_multiple_of(4096),
            "buffers must be whole 4 KiB pages"
        );
        assert!(count > 0 && count <= POOL_BUFFERS_MAX);
        let bytes = buf_bytes * count;
        let (base, map_bytes, huge_pages) = map(bytes)?;
        Ok(BufferPool {
            inner: Rc::new(PoolInner {
                base,
                map_bytes,
                buf_bytes,
                count,
                huge_pages,
                free: RefCell::new((0..count as u16).rev().collect()),
                waiters: RefCell::new(VecDeque::new()),
                acquired_total: Cell::new(0),
                exhausted_total: Cell::new(0),
            }),
        })
    }

    pub fn buf_bytes(&self) -> usize {
        self.inner.buf_bytes
    }
    pub fn count(&self) -> usize {
        self.inner.count
    }
    pub fn free_count(&self) -> usize {
        self.inner.free.borrow().len()
    }
    pub fn huge_pages(&self) -> bool {
        self.inner.huge_pages
    }
    /// Times a caller found the pool empty.
    pub fn exhausted_total(&self) -> u64 {
        self.inner.exhausted_total.get()
    }

    pub fn try_acquire(&self) -> Option<PoolBuf> {
        let index = self.inner.free.borrow_mut().pop();
        match index {
            Some(index) => {
                self.inner
                    .acquired_total
                    .set(self.inner.acquired_total.get() + 1);
                Some(PoolBuf {
                    pool: self.inner.clone(),
                    index,
                    len: 0,
                })
            }
            None => {
                self.inner
                    .exhausted_total
                    .set(self.inner.exhausted_total.get() + 1);
                None
            }
        }
    }

    /// Waits for a free buffer (back-pressure).
    pub async fn acquire(&self) -> PoolBuf {
        loop {
            if let Some(b) = self.try_acquire() {
                return b;
            }
            let (tx, rx) = oneshot::channel();
            self.inner.waiters.borrow_mut().push_back(tx);
            let _ = rx.await;
        }
    }

    /// iovecs for `register_buffers`, buffer i at index i.
    pub fn iovecs(&self) -> Vec<libc::iovec> {
        (0..self.inner.count)
            .map(|i| libc::iovec {
                // SAFETY: `i < count`: buffer i starts inside the mapping.
                iov_base: unsafe { self.inner.base.add(i * self.inner.buf_bytes) }.cast(),
                iov_len: self.inner.buf_bytes,
            })
            .collect()
    }
}

/// Anonymous mapping, huge pages first. Touched now so that the pages are
/// placed on the calling (pinned) thread's NUMA node.
fn map(bytes: usize) -> io::Result<(*mut u8, usize, bool)> {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
    let huge_bytes = bytes.next_multiple_of(HUGE_PAGE_BYTES);
    // SAFETY: a new anonymous mapping (no address hint, no file); the
    // result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            huge_bytes,
            prot,
            flags | libc::MAP_HUGETLB,
            -1,
            0,
        )
    };
    if p != libc::MAP_FAILED {
        return Ok((p.cast(), huge_bytes, true));
    }
    // SAFETY: as above, without huge pages.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), bytes, prot, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok((p.cast(), bytes, false))
}
