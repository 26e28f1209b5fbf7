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
    /// The most [`NET`] has been, and the bytes allocated in all, since [`measure_all`] began
    /// (unit tests only: not worth their cost per call in the executable).
    static HIGH: Cell<i64> = const { Cell::new(0) };
    static ALLOCATED: Cell<u64> = const { Cell::new(0) };
}

fn add(bytes: i64) {
    // `try_with` fails only while the thread's locals are torn down: those calls go uncounted.
    let _ = NET.try_with(|net| {
        net.set(net.get().wrapping_add(bytes));
        #[cfg(test)]
        {
            let _ = HIGH.try_with(|high| high.set(high.get().max(net.get())));
            if bytes > 0 {
                let _ =
                    ALLOCATED.try_with(|all| all.set(all.get().wrapping_add(bytes.unsigned_abs())));
            }
        }
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

/// What [`measure_all`] saw a closure do with the heap on this thread.
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    /// Bytes it left allocated (as [`measure`]).
    pub left: i64,
    /// The most it held at once along the way, above what the thread held when it began.
    pub peak: i64,
    /// Bytes it allocated in all (a `realloc` that grows counts its growth).
    pub allocated: u64,
}

/// Runs `f`, returning its result and what it did with the heap ([`Measured`]).
#[cfg(test)]
pub fn measure_all<T>(f: impl FnOnce() -> T) -> (T, Measured) {
    let before = NET.try_with(Cell::get).unwrap_or(0);
    let _ = HIGH.try_with(|high| high.set(before));
    let allocated = ALLOCATED.try_with(Cell::get).unwrap_or(0);
    let out = f();
    let after = NET.try_with(Cell::get).unwrap_or(before);
    let high = HIGH.try_with(Cell::get).unwrap_or(before);
    let measured = Measured {
        left: after.wrapping_sub(before),
        peak: high.wrapping_sub(before),
        allocated: ALLOCATED
            .try_with(Cell::get)
            .unwrap_or(allocated)
            .wrapping_sub(allocated),
    };
    (out, measured)
}

/// Runs `f`, returning its result and the most heap bytes it held at once on this thread above
/// what was held when it started (its transient peak; [`measure_all`]'s `peak`).
#[cfg(test)]
pub fn peak<T>(f: impl FnOnce() -> T) -> (T, i64) {
    let (out, measured) = measure_all(f);
    (out, measured.peak)
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
        let (_, m) = measure_all(|| {
            let first = vec![1u8; 4096].len();
            first + vec![2u8; 1024].len()
        });
        assert_eq!((m.left, m.peak, m.allocated), (0, 4096, 5120));
    }
}
