//! The relay's global allocator: the system allocator, counting the bytes each thread has
//! allocated and not yet freed, so the symbolizer can charge every resolver what blazesym
//! allocated for it (parsed symbol tables, DWARF units, remembered lookups) and bound its
//! cache in bytes (`--symbolizer-cache-bytes`). The count is one thread-local add per call.
//!
//! Installed by the executable (main.rs) and the unit tests; where it is not installed (other
//! users of the library), [`measure`] reports 0 and only the cache's file bound applies.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
};

/// [`System`], counting per thread.
pub struct Counting;

thread_local! {
    /// Bytes this thread allocated minus the bytes it freed (negative when it freed what
    /// another thread allocated). A const `Cell` has no destructor, so using it inside the
    /// allocator never allocates or registers anything.
    static NET: Cell<i64> = const { Cell::new(0) };
}

#[cfg(test)]
thread_local! {
    /// The highest [`NET`] this thread reached (tests only: [`peak`]).
    static HIGH: Cell<i64> = const { Cell::new(0) };
}

fn add(bytes: i64) {
    // `try_with` fails only while the thread's locals are torn down: those calls go uncounted.
    let _ = NET.try_with(|net| {
        net.set(net.get().wrapping_add(bytes));
        #[cfg(test)]
        let _ = HIGH.try_with(|high| high.set(high.get().max(net.get())));
    });
}

fn signed(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

// SAFETY: every call is forwarded to `System` unchanged; the count has no effect on allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            add(signed(layout.size()));
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            add(signed(layout.size()));
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) };
        add(-signed(layout.size()));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            add(signed(new_size) - signed(layout.size()));
        }
        new
    }
}

/// Runs `f`, returning its result and the heap bytes it left allocated on this thread (what
/// it allocated minus what it freed; 0 when [`Counting`] is not the global allocator).
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, i64) {
    let before = NET.try_with(Cell::get).unwrap_or(0);
    let out = f();
    let after = NET.try_with(Cell::get).unwrap_or(before);
    (out, after.wrapping_sub(before))
}

/// Runs `f`, returning its result and the most heap bytes it held at once on this thread above
/// what was held when it started (its transient peak; tests only).
#[cfg(test)]
pub fn peak<T>(f: impl FnOnce() -> T) -> (T, i64) {
    let before = NET.try_with(Cell::get).unwrap_or(0);
    let _ = HIGH.try_with(|high| high.set(before));
    let out = f();
    let high = HIGH.try_with(Cell::get).unwrap_or(before);
    (out, high.wrapping_sub(before))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_is_the_most_held_at_once_not_what_is_left() {
        // When a closure holds 1 MiB, frees it, then holds 64 KiB
        let ((), high) = peak(|| {
            drop(vec![0u8; 1 << 20]);
            drop(vec![0u8; 1 << 16]);
        });
        // Then its peak is the 1 MiB, though it left nothing allocated
        assert!((1 << 20..(1 << 20) + 4096).contains(&high), "{high}");
    }

    #[test]
    fn counts_what_a_closure_leaves_allocated() {
        // The unit tests run with `Counting` installed (lib.rs).
        let (kept, bytes) = measure(|| vec![0u8; 1 << 20]);
        assert!(bytes >= 1 << 20, "{bytes}");
        let ((), freed) = measure(move || drop(kept));
        assert!(freed <= -(1 << 20), "{freed}");
        let (_, temporary) = measure(|| vec![1u8; 4096].len());
        assert_eq!(temporary, 0);
    }
}
