//! Activity buffers handed to CUPTI: allocated on demand up to a cap, reused after the
//! background thread has decoded them. A buffer CUPTI returns that this pool did not allocate
//! (another client's, after it re-registered callbacks) is never freed or reused here.
//!
//! A zeroing pool hands out only zeroed buffers: new ones come zeroed from the allocator, and
//! used ones are zeroed by [`Pool::recycle`] on the background thread, so CUPTI (told so with
//! `CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER`) need not zero them on the application
//! thread that asks for a buffer.
// Safety: raw allocation and deallocation of the buffers, with the layout recorded at allocation.
#![allow(unsafe_code)]

use std::alloc::Layout;
use std::collections::HashSet;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// CUPTI requires 8-byte aligned buffers.
const ALIGN: usize = 8;

/// An owned activity buffer of the pool's size.
#[derive(Debug)]
pub struct Buf(NonNull<u8>);

// Safety: a Buf is a uniquely owned heap allocation; moving it between threads is fine.
unsafe impl Send for Buf {}

impl Buf {
    pub fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }

    /// Gives up ownership (to CUPTI); [`Pool::claim`] takes it back.
    pub fn into_raw(self) -> *mut u8 {
        self.0.as_ptr()
    }
}

pub struct Pool {
    size: usize,
    max: usize,
    zeroed: bool,
    free: Mutex<Vec<Buf>>,
    /// Addresses of every live buffer this pool allocated.
    ours: Mutex<HashSet<usize>>,
    allocated: AtomicUsize,
    /// Handed to CUPTI and not returned yet.
    outstanding: AtomicUsize,
    /// Requests declined because the cap was reached.
    declined: AtomicUsize,
}

impl Pool {
    pub fn new(size: usize, max: usize, zeroed: bool) -> Pool {
        Pool {
            size,
            max,
            zeroed,
            free: Mutex::new(Vec::new()),
            ours: Mutex::new(HashSet::new()),
            allocated: AtomicUsize::new(0),
            outstanding: AtomicUsize::new(0),
            declined: AtomicUsize::new(0),
        }
    }

    pub fn buffer_size(&self) -> usize {
        self.size
    }

    fn layout(&self) -> Layout {
        Layout::from_size_align(self.size, ALIGN).expect("valid buffer layout")
    }

    /// Whether every buffer handed out is zeroed.
    pub fn zeroed(&self) -> bool {
        self.zeroed
    }

    /// Allocates a buffer (under the cap), zeroed when this pool zeroes.
    fn allocate(&self) -> Option<Buf> {
        if self.allocated.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.allocated.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        // Safety: the layout has a non-zero size.
        let p = unsafe {
            if self.zeroed { std::alloc::alloc_zeroed(self.layout()) } else { std::alloc::alloc(self.layout()) }
        };
        let Some(p) = NonNull::new(p) else {
            self.allocated.fetch_sub(1, Ordering::AcqRel);
            return None;
        };
        if let Ok(mut o) = self.ours.lock() {
            o.insert(p.as_ptr() as usize);
        }
        Some(Buf(p))
    }

    /// Allocates buffers until `n` are free (within the cap), writing every page, so that the
    /// first requests of a trace neither allocate nor fault pages in on the application thread.
    pub fn prefill(&self, n: usize) {
        loop {
            let free = self.free.lock().map(|f| f.len()).unwrap_or(n);
            if free >= n {
                return;
            }
            let Some(b) = self.allocate() else { return };
            // Safety: `b` is a live allocation of `size` bytes owned here.
            unsafe { std::ptr::write_bytes(b.as_ptr(), 0, self.size) };
            self.put(b);
        }
    }

    /// A buffer to hand to CUPTI, or None at the cap (CUPTI then drops and counts records).
    pub fn take(&self) -> Option<Buf> {
        let reused = self.free.lock().ok().and_then(|mut f| f.pop());
        let buf = match reused.or_else(|| self.allocate()) {
            Some(b) => b,
            None => {
                self.declined.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        Some(buf)
    }

    /// Claims a pointer CUPTI returned: Some if this pool allocated it.
    pub fn claim(&self, p: *mut u8) -> Option<Buf> {
        let ours = self.ours.lock().map(|o| o.contains(&(p as usize))).unwrap_or(false);
        if !ours {
            return None;
        }
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
        NonNull::new(p).map(Buf)
    }

    /// Returns a used buffer for reuse, zeroing it first when this pool zeroes (call this on
    /// the background thread: it writes the whole buffer).
    pub fn recycle(&self, b: Buf) {
        if self.zeroed {
            // Safety: `b` is a live allocation of `size` bytes, owned here.
            unsafe { std::ptr::write_bytes(b.as_ptr(), 0, self.size) };
        }
        self.put(b);
    }

    /// Returns a buffer that was not written since it was zeroed (or a non-zeroing pool's).
    pub fn put(&self, b: Buf) {
        if let Ok(mut f) = self.free.lock() {
            f.push(b);
        }
        // A poisoned lock leaks the buffer rather than risking a double free.
    }

    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }

    pub fn allocated(&self) -> usize {
        self.allocated.load(Ordering::Acquire)
    }

    pub fn declined(&self) -> usize {
        self.declined.load(Ordering::Relaxed)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let layout = self.layout();
        if let Ok(mut f) = self.free.lock() {
            for b in f.drain(..) {
                // Safety: every Buf in `free` was allocated by this pool with `layout` and is
                // not in CUPTI's hands (it was returned and decoded).
                unsafe { std::alloc::dealloc(b.0.as_ptr(), layout) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_reuses_and_refuses_foreign_pointers() {
        let p = Pool::new(4096, 2, false);
        let a = p.take().unwrap();
        let b = p.take().unwrap();
        assert!(p.take().is_none(), "cap of 2");
        assert_eq!((p.outstanding(), p.declined()), (2, 1));
        let mut foreign = [0u8; 16];
        assert!(p.claim(foreign.as_mut_ptr()).is_none());
        let a_ptr = a.into_raw(); // CUPTI holds it now
        let a = p.claim(a_ptr).expect("ours");
        assert_eq!(p.outstanding(), 1);
        p.put(a);
        let c = p.take().unwrap();
        assert_eq!(c.as_ptr(), a_ptr, "reused");
        assert_eq!(p.allocated(), 2);
        p.put(b);
        p.put(c);
        assert!(p.as_ptr_alignment_ok());
    }

    #[test]
    fn zeroing_pool_hands_out_zeroed_buffers() {
        let p = Pool::new(8192, 3, true);
        p.prefill(2);
        assert_eq!((p.allocated(), p.outstanding()), (2, 0));
        let all_zero = |b: &Buf| {
            // Safety: a live pool buffer of 8192 bytes.
            unsafe { std::slice::from_raw_parts(b.as_ptr(), 8192) }.iter().all(|&x| x == 0)
        };
        let a = p.take().unwrap();
        assert!(all_zero(&a));
        // Safety: as above; CUPTI would write records like this.
        unsafe { std::ptr::write_bytes(a.as_ptr().add(100), 0xab, 5000) };
        assert!(!all_zero(&a));
        p.recycle(a);
        let mut seen = Vec::new();
        while let Some(b) = p.take() {
            assert!(all_zero(&b), "every buffer handed out is zeroed");
            seen.push(b);
        }
        assert_eq!(seen.len(), 3, "two prefilled plus one allocated up to the cap");
        for b in seen {
            p.put(b);
        }
    }

    impl Pool {
        fn as_ptr_alignment_ok(&self) -> bool {
            self.free.lock().unwrap().iter().all(|b| (b.as_ptr() as usize).is_multiple_of(ALIGN))
        }
    }
}
