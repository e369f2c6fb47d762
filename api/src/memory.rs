//! The services' memory at start: transparent huge pages off, and the allocator's arena faulted in
//! (`paisa serve --memory-prefault-mib N`). Both are process set-up, done once before the runtime
//! starts; nothing here runs while the service serves.

/// mimalloc's variable that, when set, decides transparent huge pages instead of the services' default.
const ALLOW_HUGE_PAGES_VARIABLE: &str = "MIMALLOC_ALLOW_THP";

/// A long-running service (`serve`, `wallet-sim`) runs without transparent huge pages, unless
/// `MIMALLOC_ALLOW_THP` says otherwise (mimalloc then decides as it reads it).
///
/// Why: mimalloc asks the kernel for huge pages on its arenas, so the first touch of any byte of a
/// 2 MiB range faults in and zeroes all of it. A service's heap is many threads' small pages spread over
/// those ranges, so it touches more memory than it uses: in the serve benchmark, 347 MB resident
/// against 240 MB with 4 KiB pages, and in a slow run zeroing fresh huge pages took ≈ 15 % of the
/// service's CPU (`docs/DECISIONS.md`, "Services run without transparent huge pages"). `paisa replay`
/// keeps them: one thread reading a gigabyte of state at random, where they spare TLB misses.
///
/// `prctl(PR_SET_THP_DISABLE)` rather than mimalloc's option: mimalloc maps its first arena before
/// `main`, and the process-wide flag covers every mapping, earlier ones included.
pub fn disable_transparent_huge_pages() {
    if std::env::var_os(ALLOW_HUGE_PAGES_VARIABLE).is_some() {
        return;
    }
    // SAFETY: integer arguments only; the call changes this process's memory policy, nothing in it.
    let result = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if result != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "could not turn transparent huge pages off");
    }
}

/// Why the arena could not be faulted in. None of these stops the service: it then faults its pages
/// in as it first touches them, as without the option.
#[derive(Debug, thiserror::Error)]
pub enum PrefaultError {
    #[error("reading /proc/self/maps: {0}")]
    Maps(std::io::Error),
    #[error("no writable anonymous mapping holds the allocator's heap (a block at {address:#x})")]
    NoArena { address: usize },
    #[error("madvise(MADV_POPULATE_WRITE) of {bytes} bytes at {start:#x} (Linux 5.14 or later): {error}")]
    Populate { start: usize, bytes: usize, error: std::io::Error },
}

/// One line of `/proc/self/maps`: an address range and what it maps.
#[derive(Debug, PartialEq, Eq)]
struct Mapping {
    start: usize,
    end: usize,
    writable: bool,
    /// No file or special name (`[heap]`, `[stack]`): memory the process mapped for itself, as
    /// mimalloc maps its arenas.
    anonymous: bool,
}

/// Parses one `/proc/self/maps` line (`start-end perms offset device inode [path]`); `None` if it is
/// not one.
fn parse_mapping(line: &str) -> Option<Mapping> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let permissions = fields.next()?;
    // Offset, device and inode come before the path, which anonymous mappings do not have.
    let path = fields.nth(3);
    Some(Mapping {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        writable: permissions.starts_with("rw"),
        anonymous: path.is_none(),
    })
}

/// The mapping of `maps` (the text of `/proc/self/maps`) that holds `address`, if any.
fn mapping_holding(maps: &str, address: usize) -> Option<Mapping> {
    maps.lines().filter_map(parse_mapping).find(|mapping| mapping.start <= address && address < mapping.end)
}

/// The allocator's arena that holds `address` (a block it allocated): a writable anonymous mapping.
fn arena_holding(address: usize) -> Result<Mapping, PrefaultError> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(PrefaultError::Maps)?;
    mapping_holding(&maps, address)
        .filter(|mapping| mapping.writable && mapping.anonymous)
        .ok_or(PrefaultError::NoArena { address })
}

/// What [`fault_in_arena`] faulted in.
#[derive(Debug)]
pub struct FaultedIn {
    /// Where the allocator's arena starts, and so the memory faulted in.
    pub start: usize,
    /// The arena's size: the most this can fault in.
    pub arena_bytes: usize,
    /// What was faulted in: the bytes asked for, or the whole arena if it is smaller.
    pub bytes: usize,
}

/// Faults in the first `bytes` of the allocator's arena (the whole arena if it is smaller), without
/// changing a byte of it: `madvise(MADV_POPULATE_WRITE)` maps each page as a first write would, zeroed,
/// and writes nothing. So the pages the service allocates next are already mapped.
///
/// The arena is the anonymous mapping that holds a fresh small allocation: mimalloc's, which reserves
/// 1 GiB at a time and hands out its pages from the start. Why the arena itself and not memory
/// allocated and freed: mimalloc puts a large block into a 32 MiB chunk of its own and a thread's small
/// pages into other chunks, so memory touched through large blocks was mostly not where the service
/// then allocated (the forty-seventh round: 768 MiB touched in 16 MiB blocks left ≈ 18,500 pages to
/// fault in during the serve benchmark's bulk phase and 262 MB in a second arena never used;
/// `docs/DECISIONS.md`, "A service can fault its memory in at start").
///
/// Call at start-up: populating is safe beside other threads (no byte changes), but it takes time.
pub fn fault_in_arena(bytes: usize) -> Result<FaultedIn, PrefaultError> {
    // A small block, so that it comes from where the service's small allocations will.
    let probe = Box::new(0_u64);
    let arena = arena_holding(std::ptr::from_ref(probe.as_ref()) as usize)?;
    drop(probe);
    let arena_bytes = arena.end - arena.start;
    let populated = bytes.min(arena_bytes);
    // SAFETY: the range lies inside one writable anonymous private mapping of this process (mimalloc's
    // arena, mapped for the process's life). MADV_POPULATE_WRITE only maps pages; it reads and writes
    // no byte of them, so no allocation, made or to come, sees a change.
    let result = unsafe { libc::madvise(arena.start as *mut libc::c_void, populated, libc::MADV_POPULATE_WRITE) };
    if result != 0 {
        let error = std::io::Error::last_os_error();
        return Err(PrefaultError::Populate { start: arena.start, bytes: populated, error });
    }
    Ok(FaultedIn { start: arena.start, arena_bytes, bytes: populated })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55ea1d020000-55ea1d2e6000 r--p 00000000 fe:01 1835017                    /tmp/paisa
20000000000-20040000000 rw-p 00000000 00:00 0 
7ffd8a5e1000-7ffd8a602000 rw-p 00000000 00:00 0                          [stack]
7fb392d07000-7fb392e5d000 r-xp 00028000 fe:01 1048843                    /usr/lib/x86_64-linux-gnu/libc.so.6
";

    #[test]
    fn maps_lines_parse_into_ranges_and_what_they_map() {
        let arena = Mapping { start: 0x200_0000_0000, end: 0x200_4000_0000, writable: true, anonymous: true };
        assert_eq!(mapping_holding(MAPS, 0x200_0000_0000), Some(arena));
        let binary = mapping_holding(MAPS, 0x55ea_1d02_1000).expect("the binary's mapping");
        assert!(!binary.writable && !binary.anonymous);
        let stack = mapping_holding(MAPS, 0x7ffd_8a5e_1008).expect("the stack");
        assert!(stack.writable && !stack.anonymous, "a named mapping is not the allocator's");
        // The end is exclusive, and an address no line covers has no mapping.
        assert_eq!(mapping_holding(MAPS, 0x200_4000_0000), None);
        assert_eq!(mapping_holding(MAPS, 0x1000), None);
        assert_eq!(parse_mapping("not a mapping"), None);
        assert_eq!(parse_mapping(""), None);
    }

    /// Whether every page of `[start, start + bytes)` is resident, by `mincore`.
    fn resident(start: usize, bytes: usize) -> bool {
        // SAFETY: a query without arguments.
        let page_bytes = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).expect("a page size");
        let mut pages = vec![0_u8; bytes.div_ceil(page_bytes)];
        // SAFETY: the range is mapped (the arena) and `pages` has one byte per page of it.
        let result = unsafe { libc::mincore(start as *mut libc::c_void, bytes, pages.as_mut_ptr()) };
        assert_eq!(result, 0, "mincore: {}", std::io::Error::last_os_error());
        pages.iter().all(|page| page & 1 == 1)
    }

    #[test]
    fn the_arena_holding_the_heap_is_faulted_in_without_changing_what_it_holds() {
        let kept: Vec<u64> = (0..1024).collect();
        let arena = arena_holding(kept.as_ptr() as usize).expect("the arena holding the heap");
        // More than a test process has touched of its arena, so that the call has pages to fault in.
        let asked = (64 << 20_usize).min(arena.end - arena.start);
        assert!(!resident(arena.start, asked), "a fresh arena is not all resident yet");
        let faulted_in = fault_in_arena(asked).expect("this kernel populates (Linux 5.14 or later)");
        assert_eq!((faulted_in.start, faulted_in.arena_bytes), (arena.start, arena.end - arena.start));
        assert_eq!(faulted_in.bytes, asked);
        assert!(resident(faulted_in.start, faulted_in.bytes), "every page faulted in is resident");
        // What the arena held before is intact: populating writes nothing.
        assert!(kept.iter().enumerate().all(|(index, value)| *value == index as u64));
    }
}
