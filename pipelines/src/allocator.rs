//! The global allocator the `paisa` binary, the engine benchmark and the profiling examples install:
//! mimalloc, called through its plain entry points whenever the request's alignment is one every
//! mimalloc block has anyway. The engine itself never names it (allocation is not I/O; the stages stay
//! pure whichever allocator runs them).
//!
//! Why not `mimalloc::MiMalloc`: it sends every request to `mi_malloc_aligned`, and mimalloc v3 serves
//! that from the size class's free list only while the list has a block at hand. Otherwise it takes the
//! plain path only for power-of-two block sizes and over-allocates for any other size: a larger block,
//! aligned by hand, and a size class that is then rarely refilled. Growing vectors of 200–500-byte
//! records (sub-orders, statement lines, journals) are such sizes. Measured on the engine benchmark's
//! workload: 2.2 % fewer instructions inside `Engine::apply` (callgrind, `profile_replay 2000 6`: 795.0 M →
//! 777.7 M), 1.7 % less peak memory (1,154 → 1,134 MB for `profile_replay 5000 23`); the wall-clock time
//! did not move measurably on this machine (paired runs within its ±5 % noise). Rust's alignments above the word are rare here
//! (none of the engine's types needs more), and they still go to the aligned entry points.

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc, mi_zalloc_aligned,
};
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// mimalloc for every allocation, through its plain entry points where they suffice.
pub struct Allocator;

/// mimalloc v3's `mi_option_purge_delay` (`mi_option_t`; the sys crate names no constant for it).
const OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// The environment variable mimalloc reads the same option from.
const PURGE_DELAY_VARIABLE: &str = "MIMALLOC_PURGE_DELAY";

/// Configures mimalloc for a long-running engine: memory it once mapped stays mapped (no purging), so
/// freed blocks are reused without the kernel faulting and zeroing fresh pages again, and the
/// transparent huge pages mimalloc asks for by default stay whole (purging part of one splits it).
///
/// Why: the engine's state only grows (orders, sub-orders, statement lines, journals), so the process
/// never has memory to give back but its transient buffers, which it reuses. Its state is read at
/// random across a gigabyte at the benchmark's scale, where 2 MiB pages spare most TLB misses
/// (measured on the engine benchmark's workload: `docs/DECISIONS.md`, "The allocator keeps what it maps").
///
/// Transparent huge pages are left to mimalloc's default (on): `MIMALLOC_ALLOW_THP=0` turns them off,
/// and mimalloc's option can only come from the environment, because mimalloc reads it when it maps its
/// first arena, before `main` (the `paisa` services turn huge pages off for the whole process with
/// `prctl` instead: `docs/DECISIONS.md`, "Services run without transparent huge pages").
/// `MIMALLOC_PURGE_DELAY` in the environment (milliseconds) overrides the no-purge setting. Call at
/// start-up, before other threads exist.
pub fn configure() {
    if std::env::var_os(PURGE_DELAY_VARIABLE).is_none() {
        set_purge_delay_ms(None);
    }
}

/// How long memory freed stays mapped before mimalloc returns it to the OS; `None`: for good (what
/// [`configure`] sets). The engine benchmark also measures with `Some(0)`, where every sample's state
/// grows into fresh pages as a new process's does.
pub fn set_purge_delay_ms(delay_ms: Option<u32>) {
    let value = delay_ms.map_or(-1, std::ffi::c_long::from);
    // SAFETY: an integer option; mimalloc reads it whenever it decides a purge, from any thread.
    unsafe { libmimalloc_sys::mi_option_set(OPTION_PURGE_DELAY, value) };
}

/// Every mimalloc block is aligned to at least a word: block sizes are multiples of it and pages start
/// aligned (and `malloc` must return memory fit for any word-sized object).
const PLAIN_ALIGNMENT_MAX: usize = std::mem::size_of::<usize>();

fn plain(layout: &Layout) -> bool {
    layout.align() <= PLAIN_ALIGNMENT_MAX
}

// SAFETY: each method forwards to mimalloc's matching entry point, which returns null on failure, a block
// of at least the requested size, aligned to at least `PLAIN_ALIGNMENT_MAX` (plain entry points, used only
// when that suffices) or to the requested alignment (aligned ones). `dealloc` and `realloc` receive
// pointers this allocator returned, which `mi_free` and `mi_realloc` accept whichever entry point made them.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain(&layout) {
            mi_malloc(layout.size()).cast()
        } else {
            mi_malloc_aligned(layout.size(), layout.align()).cast()
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain(&layout) {
            mi_zalloc(layout.size()).cast()
        } else {
            mi_zalloc_aligned(layout.size(), layout.align()).cast()
        }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, _layout: Layout) {
        mi_free(pointer.cast::<c_void>())
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if plain(&layout) {
            mi_realloc(pointer.cast::<c_void>(), new_size).cast()
        } else {
            mi_realloc_aligned(pointer.cast::<c_void>(), new_size, layout.align()).cast()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of every size class up to 64 KiB and alignments from 1 to 4 KiB come back aligned, hold
    /// their bytes, and keep them through growth and shrinking.
    #[test]
    fn every_block_is_aligned_and_keeps_its_bytes_through_realloc() {
        let sizes = (1..=64usize).chain((72..=4096).step_by(40)).chain([1000, 1500, 5000, 65_536]);
        for size in sizes {
            for align in [1usize, 2, 4, 8, 16, 64, 4096] {
                let layout = Layout::from_size_align(size, align).expect("a valid layout");
                // SAFETY: a non-zero size; the block is written within its size and freed once, by the
                // allocator that made it, with its layout.
                unsafe {
                    let block = Allocator.alloc(layout);
                    assert!(!block.is_null(), "{size} bytes aligned to {align}");
                    assert_eq!(block as usize % align, 0, "{size} bytes aligned to {align}");
                    for offset in 0..size {
                        block.add(offset).write((offset % 251) as u8);
                    }
                    let grown_size = size * 3 + 17;
                    let grown = Allocator.realloc(block, layout, grown_size);
                    assert_eq!(grown as usize % align, 0, "{size} → {grown_size} bytes aligned to {align}");
                    assert!((0..size).all(|offset| grown.add(offset).read() == (offset % 251) as u8));
                    let grown_layout = Layout::from_size_align(grown_size, align).expect("a valid layout");
                    let shrunk = Allocator.realloc(grown, grown_layout, size.div_ceil(2));
                    assert!((0..size.div_ceil(2)).all(|offset| shrunk.add(offset).read() == (offset % 251) as u8));
                    let shrunk_layout = Layout::from_size_align(size.div_ceil(2), align).expect("a valid layout");
                    Allocator.dealloc(shrunk, shrunk_layout);
                    let zeroed = Allocator.alloc_zeroed(layout);
                    assert_eq!(zeroed as usize % align, 0);
                    assert!((0..size).all(|offset| zeroed.add(offset).read() == 0), "{size} zeroed bytes");
                    Allocator.dealloc(zeroed, layout);
                }
            }
        }
    }
}
