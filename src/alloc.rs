//! The global allocator: mimalloc, called the way the system allocator calls `malloc`.
//!
//! The `mimalloc` crate's allocator passes every allocation through mimalloc's aligned API,
//! whose fast path covers only blocks up to 1 KiB: anything larger (a request's header map,
//! an origin connection's read buffer) took a generic path of ~225 instructions instead of
//! ~40 (callgrind). Allocations whose alignment mimalloc's plain API already guarantees go
//! to `mi_malloc` and friends here; the rest still use the aligned API.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys::{mi_free, mi_malloc, mi_realloc, mi_zalloc};

/// mimalloc with its plain (not aligned) API for the alignments that API guarantees.
pub struct Allocator;

/// Whether a block of `size` bytes from mimalloc's plain API is aligned to `align`.
///
/// mimalloc's size classes are all multiples of 8 bytes (the smallest is 8) and a page's
/// first block is 16-byte aligned (`MI_PAGE_MIN_START_BLOCK_ALIGN`), so every block is
/// 8-byte aligned. A size that is a multiple of 16 lands in a class that is a multiple of 16
/// (the classes that are not, 24, 40 and 56, only take sizes 17-24, 33-40 and 49-56), so its
/// blocks are 16-byte aligned. Larger alignments use the aligned API.
#[inline]
fn plain_api_aligns(size: usize, align: usize) -> bool {
    align <= 8 || (align == 16 && size % 16 == 0)
}

// SAFETY: every method hands mimalloc a layout it serves with at least the layout's
// alignment (`plain_api_aligns` above for the plain API; the aligned API otherwise), frees
// with `mi_free` (which takes blocks of either API), and returns null on failure as
// `GlobalAlloc` requires.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain_api_aligns(layout.size(), layout.align()) {
            // SAFETY: plain allocation; alignment shown by `plain_api_aligns`.
            unsafe { mi_malloc(layout.size()) as *mut u8 }
        } else {
            // SAFETY: delegated to the `mimalloc` crate's aligned allocation.
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain_api_aligns(layout.size(), layout.align()) {
            // SAFETY: as in `alloc`.
            unsafe { mi_zalloc(layout.size()) as *mut u8 }
        } else {
            // SAFETY: as in `alloc`.
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from mimalloc (either API).
        unsafe { mi_free(ptr as *mut c_void) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if plain_api_aligns(new_size, layout.align()) {
            // SAFETY: `ptr` is a live mimalloc block; the new block's alignment is shown by
            // `plain_api_aligns` for `new_size`.
            unsafe { mi_realloc(ptr as *mut c_void, new_size) as *mut u8 }
        } else {
            // SAFETY: delegated to the `mimalloc` crate's aligned reallocation.
            unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of every size up to a few pages, at every alignment the plain API takes, are
    /// aligned; and so are blocks of the aligned API, after reallocation too.
    #[test]
    fn every_block_is_aligned_as_its_layout_asks() {
        let a = Allocator;
        for size in (1..2048).chain([4095, 4096, 10_000, 70_000]) {
            for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
                let Ok(layout) = Layout::from_size_align(size, align) else {
                    continue;
                };
                // SAFETY: a non-zero-size layout; the block is checked, written, grown and
                // freed with the same layout.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    p.write_bytes(0xab, size);
                    let q = a.realloc(p, layout, size * 2 + 16);
                    assert_eq!(q as usize % align, 0, "realloc size {size} align {align}");
                    assert_eq!(*q.add(size - 1), 0xab);
                    a.dealloc(q, Layout::from_size_align_unchecked(size * 2 + 16, align));
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0);
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
