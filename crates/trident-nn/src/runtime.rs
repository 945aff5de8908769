//! Process-wide settings for training.

/// Asks glibc's allocator to keep freed memory for reuse instead of returning it to the
/// kernel. A training step allocates and frees the same activation and gradient buffers
/// (megabytes each) every step; by default glibc serves such blocks with `mmap` and unmaps
/// them on free, so every step page-faults all of them in again (6 % of a MiniLM step's
/// samples were page faults, `docs/PERFORMANCE.md`). So: no `mmap` for any block (glibc's
/// threshold tops out at 32 MiB, and an EfficientNet batch of 200 at 112 px has 240 MiB
/// activations) and no trimming of the heap's free top (a pass that frees a gigabyte at its
/// end returned it, and the next pass faulted it in again: an EfficientNet evaluation ran at
/// 42 images/s with 57 % of its time in the kernel, 122/s without). The process keeps its
/// peak size until it exits. And one arena for all threads: a loop run on a rayon worker
/// ([`on_pool`]) allocated from that thread's own arena, whose 64 MiB heaps glibc unmaps
/// whenever one falls empty, trim threshold or not — `trident eval` of a conv autoencoder
/// on the pool faulted its batches in again each time (system time 0.2 → 0.6 s, the run
/// 1.7 → 2.1 s), and an EfficientNet fine-tune held its training arena's peak beside the
/// main arena's test pass (peak RSS 1.04 → 1.55 GB); the main arena keeps and reuses them.
/// A thread's first allocation picks its arena, so call this before any other thread
/// starts (as `trident`'s commands and the step examples do). Idempotent; a no-op off glibc.
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
        const M_MMAP_MAX: c_int = -4;
        const M_ARENA_MAX: c_int = -8;
        // SAFETY: mallopt only changes allocator parameters; these are documented values
        // (an mmap count of 0 turns mmap off; a trim threshold of -1, read as the largest
        // size, turns trimming off; one arena for every thread).
        unsafe {
            mallopt(M_MMAP_MAX, 0) == 1
                && mallopt(M_TRIM_THRESHOLD, -1) == 1
                && mallopt(M_TOP_PAD, 64 << 20) == 1
                && mallopt(M_ARENA_MAX, 1) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Runs candle's own CPU kernels (elementwise ops, reductions, copies, its convolution) on
/// the calling thread, unless `CANDLE_NUM_THREADS` is already set. candle 0.11 spreads
/// them over a pool synchronised by spinning barriers; on the 2 to 4 cores Trident trains
/// on, that pool competes with OpenBLAS's threads and the data loader, and the caller
/// spins while a worker waits for a core (67 % of a dense autoencoder's sampled backward
/// pass). Measured on an AMD EPYC Zen 4 with 2 cores, interleaved (`docs/PERFORMANCE.md`):
/// the MiniLM step 1.10x, the Fashion CNN 1.10x and ViT 1.15x faster on one thread.
/// Reads the pool size when the pool is first used, so call it at the start of `main`,
/// before any other thread exists (it sets an environment variable).
pub fn candle_on_one_thread() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}

/// Runs a training loop (or `trident eval`'s and `predict`'s passes) on a worker of rayon's
/// global pool rather than on the calling thread. The kernels' parallel loops then share their work with the other workers
/// directly; called from outside the pool, every one of them queued its work, woke the
/// workers and put the caller to sleep until they finished — a context switch each way per
/// op and one more thread than cores (the dense autoencoder's epoch 10–25 % shorter on
/// 2 cores). The loaders, monitor and sampler are threads of their own; should one of them
/// ever hand rayon work to the pool while the loop waits for it, another worker runs it —
/// with a single worker the loop stays on the calling thread, where no wait can deadlock.
pub fn on_pool<T: Send>(fit: impl FnOnce() -> T + Send) -> T {
    if rayon::current_num_threads() < 2 {
        return fit();
    }
    rayon::scope(|_| fit())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_loop_from_outside_the_pool_runs_on_one_of_its_workers() {
        // The test's thread is no worker; on_pool hands the loop to the global pool when it
        // has two workers or more, and keeps it on this thread otherwise.
        assert!(rayon::current_thread_index().is_none());
        let on_worker = super::on_pool(rayon::current_thread_index).is_some();
        assert_eq!(on_worker, rayon::current_num_threads() >= 2);
        assert_eq!(super::on_pool(|| 6 * 7), 42);
    }
}
