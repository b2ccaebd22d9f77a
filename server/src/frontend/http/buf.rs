//! The connection's read buffer: grows on demand, never past a fixed bound.

/// Below this much free tail space, move the unread bytes to the front
/// before reading, so reads stay reasonably large.
const SPARE_MIN_BYTES: usize = 2 * 1024;

#[derive(Debug)]
pub(crate) struct ReadBuf {
    bytes: Vec<u8>,
    /// Unread bytes are `bytes[start..end]`.
    start: usize,
    end: usize,
    capacity_max_bytes: usize,
}

impl ReadBuf {
    pub(crate) fn new(initial_bytes: usize, capacity_max_bytes: usize) -> Self {
        debug_assert!(capacity_max_bytes > 0);
        ReadBuf {
            bytes: vec![0; initial_bytes.min(capacity_max_bytes)],
            start: 0,
            end: 0,
            capacity_max_bytes,
        }
    }

    pub(crate) fn data(&self) -> &[u8] {
        &self.bytes[self.start..self.end]
    }

    pub(crate) fn len(&self) -> usize {
        self.end - self.start
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    pub(crate) fn consume(&mut self, consumed_bytes: usize) {
        debug_assert!(consumed_bytes <= self.len());
        self.start += consumed_bytes.min(self.len());
        if self.start == self.end {
            // Cheap reset so that the next read gets the whole buffer.
            self.start = 0;
            self.end = 0;
        }
    }

    /// Free space to read into; empty only when the buffer is at its bound
    /// and full of unread bytes.
    pub(crate) fn spare_mut(&mut self) -> &mut [u8] {
        if self.bytes.len() - self.end < SPARE_MIN_BYTES && self.start > 0 {
            self.bytes.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.bytes.len() && self.bytes.len() < self.capacity_max_bytes {
            let grown_bytes = (self.bytes.len() * 2)
                .max(SPARE_MIN_BYTES)
                .min(self.capacity_max_bytes);
            self.bytes.resize(grown_bytes, 0);
        }
        debug_assert!(self.bytes.len() <= self.capacity_max_bytes);
        &mut self.bytes[self.end..]
    }

    /// Marks `read_bytes` of the slice from `spare_mut` as filled.
    pub(crate) fn commit(&mut self, read_bytes: usize) {
        debug_assert!(self.end + read_bytes <= self.bytes.len());
        self.end = (self.end + read_bytes).min(self.bytes.len());
    }

    #[cfg(test)]
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn into_unread(mut self) -> Vec<u8> {
        self.bytes.truncate(self.end);
        self.bytes.drain(..self.start);
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_bound_and_no_further() {
        let mut buf = ReadBuf::new(4096, 10_000);
        let mut total_bytes = 0;
        loop {
            let spare = buf.spare_mut();
            if spare.is_empty() {
                break;
            }
            let n = spare.len().min(3000);
            spare[..n].fill(7);
            buf.commit(n);
            total_bytes += n;
        }
        assert_eq!(total_bytes, 10_000);
        assert_eq!(buf.allocated_bytes(), 10_000);
        assert!(buf.data().iter().all(|&b| b == 7));
    }

    #[test]
    fn compacts_instead_of_growing() {
        let mut buf = ReadBuf::new(4096, 1 << 20);
        let spare = buf.spare_mut();
        spare[..4096].copy_from_slice(&[1; 4096]);
        buf.commit(4096);
        buf.consume(4000);
        let spare_bytes = buf.spare_mut().len();
        assert_eq!(spare_bytes, 4000);
        assert_eq!(buf.allocated_bytes(), 4096);
        assert_eq!(buf.data(), &[1; 96][..]);
        buf.consume(96);
        assert!(buf.is_empty());
        assert_eq!(buf.into_unread(), Vec::<u8>::new());
    }

    #[test]
    fn into_unread_keeps_pending_bytes() {
        let mut buf = ReadBuf::new(16, 16);
        buf.spare_mut()[..5].copy_from_slice(b"abcde");
        buf.commit(5);
        buf.consume(2);
        assert_eq!(buf.into_unread(), b"cde");
    }
}
