//! Hints to the CPU to bring memory into cache ahead of its use. They change no answer: a prefetch never
//! faults and never writes, so the engine stays deterministic whether or not the hint is taken.

/// Bytes in a cache line on the machines we run on (x86-64).
const CACHE_LINE_BYTES: usize = 64;

/// Asks for the cache line at `address`, which need not be mapped; nothing on other architectures.
#[inline]
pub(crate) fn address(address: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint that never faults and never writes, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(address as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// Asks for the first cache line of `value`.
#[inline]
pub(crate) fn value<T>(value: &T) {
    address(value as *const T as usize);
}

/// Asks for the cache lines `value` spans, at most `lines_max` of them (a large value's first lines hold
/// what is read first).
#[inline]
pub(crate) fn lines<T>(value: &T, lines_max: usize) {
    let start = value as *const T as usize;
    let end = start + std::mem::size_of::<T>();
    let mut line = start & !(CACHE_LINE_BYTES - 1);
    for _ in 0..lines_max {
        if line >= end {
            break;
        }
        address(line);
        line += CACHE_LINE_BYTES;
    }
}
