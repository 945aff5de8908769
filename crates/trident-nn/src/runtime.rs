//! Process-wide settings for training.

/// Asks glibc's allocator to keep freed memory for reuse instead of returning it to the
/// kernel. A training step allocates and frees the same activation and gradient buffers
/// (megabytes each) every step; by default glibc serves such blocks with `mmap` and unmaps
/// them on free, so every step page-faults all of them in again (6 % of a MiniLM step's
/// samples were page faults, `docs/PERFORMANCE.md`). Idempotent; a no-op off glibc.
/// Returns whether the settings were accepted.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::raw::c_int;
        extern "C" {
            fn mallopt(param: c_int, value: c_int) -> c_int;
        }
        const M_TRIM_THRESHOLD: c_int = -1;
        const M_TOP_PAD: c_int = -2;
        const M_MMAP_THRESHOLD: c_int = -3;
        // SAFETY: mallopt only changes allocator parameters; these are documented values
        // (the mmap threshold at glibc's 64-bit maximum of 32 MiB).
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1
                && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1
                && mallopt(M_TOP_PAD, 64 << 20) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
