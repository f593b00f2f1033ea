//! A tiny fixed thread pool for the kernels: `run(f)` calls `f(0..threads)` once per thread
//! (the caller is thread 0) and returns when all are done.
//!
//! Work is split by the kernels over output columns and rows only, so how the pool
//! schedules never changes a result. Workers spin briefly before sleeping on a condvar:
//! a forward pass makes hundreds of short parallel calls and wake-up latency would dominate.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Spin iterations before a worker goes to sleep.
const SPIN: u32 = 20_000;

type Job = dyn Fn(usize) + Sync;

/// A pointer to the current job; only dereferenced while `run` is blocked waiting.
#[derive(Clone, Copy)]
struct JobPtr(*const Job);
// SAFETY: the pointee is `Sync` and outlives every use (see `Pool::run`).
unsafe impl Send for JobPtr {}

struct Shared {
    /// Incremented for every job; workers run a job when they see a new value.
    generation: AtomicU64,
    /// Workers still running the current job.
    pending: AtomicUsize,
    /// Set if a job panicked in a worker.
    panicked: AtomicBool,
    /// The current job (valid while `pending > 0`).
    job: Mutex<Option<JobPtr>>,
    /// Wakes sleeping workers.
    wake: Condvar,
    /// Set on drop.
    shutdown: AtomicBool,
}

/// The pool. `threads` = 1 runs everything on the caller.
pub struct Pool {
    threads: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises `run` calls from different threads.
    running: Mutex<()>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("threads", &self.threads).finish()
    }
}

impl Pool {
    /// Starts `threads - 1` workers (at least one thread in all).
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            job: Mutex::new(None),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        let workers = (1..threads)
            .map(|id| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("samewise-kernel-{id}"))
                    .spawn(move || worker(id, &shared))
            })
            .filter_map(std::result::Result::ok)
            .collect::<Vec<_>>();
        // if the OS refused a thread, run with the ones we got
        let threads = workers.len() + 1;
        Self { threads, shared, workers, running: Mutex::new(()) }
    }

    /// Number of threads, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(t)` for every thread index `t` in `0..threads()`, returning when all are done.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.threads == 1 {
            f(0);
            return;
        }
        let _guard = self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // SAFETY: the lifetime is erased only for as long as this call blocks: we do not
        // return before `pending` is back to zero, i.e. before every worker is done with `f`.
        let ptr: *const Job = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(f) };
        {
            let mut job = self.shared.job.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            *job = Some(JobPtr(ptr));
            self.shared.pending.store(self.threads - 1, Ordering::SeqCst);
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
        }
        self.shared.wake.notify_all();
        f(0);
        let mut spins = 0u32;
        while self.shared.pending.load(Ordering::Acquire) != 0 {
            // on a loaded machine the worker may share our core: let it run
            spins += 1;
            if spins < 2_000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if self.shared.panicked.swap(false, Ordering::SeqCst) {
            tracing::error!("a kernel worker panicked; its part of the result is invalid");
        }
    }
}

fn worker(id: usize, shared: &Shared) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0;
        loop {
            if shared.shutdown.load(Ordering::Acquire) {
                return;
            }
            if shared.generation.load(Ordering::Acquire) != seen {
                break;
            }
            if spins < SPIN {
                spins += 1;
                std::hint::spin_loop();
            } else {
                let job = shared.job.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if shared.generation.load(Ordering::Acquire) == seen && !shared.shutdown.load(Ordering::Acquire) {
                    drop(shared.wake.wait(job).unwrap_or_else(std::sync::PoisonError::into_inner));
                }
            }
        }
        seen = shared.generation.load(Ordering::Acquire);
        let job = *shared.job.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(JobPtr(ptr)) = job {
            // SAFETY: `run` keeps the job alive until `pending` reaches zero, which happens
            // only after this call returns.
            let f = unsafe { &*ptr };
            if catch_unwind(AssertUnwindSafe(|| f(id))).is_err() {
                shared.panicked.store(true, Ordering::SeqCst);
            }
        }
        shared.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _job = self.shared.job.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The half-open range of `0..n` that thread `t` of `threads` handles (contiguous, balanced).
pub fn split(n: usize, t: usize, threads: usize) -> std::ops::Range<usize> {
    (n * t / threads)..(n * (t + 1) / threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_once_per_call() {
        let pool = Pool::new(3);
        let hits: Vec<AtomicUsize> = (0..pool.threads()).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..1000 {
            pool.run(&|t| {
                hits[t].fetch_add(1, Ordering::SeqCst);
            });
        }
        assert_eq!(pool.threads(), 3);
        for h in &hits {
            assert_eq!(h.load(Ordering::SeqCst), 1000);
        }
    }
}
