//! A tiny fixed thread pool for the kernels: [`Pool::for_chunks`] splits `0..n` into
//! contiguous chunks that the caller and the workers claim from a shared counter.
//!
//! Kernels split work over output columns and rows only, so which thread computes which
//! chunk never changes a result. Claiming chunks dynamically keeps a busy or descheduled
//! worker from stalling the caller: whoever is running takes the next chunk. Workers spin
//! briefly before sleeping on a condvar, as a forward pass makes hundreds of short calls.

use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Spin iterations before a worker goes to sleep: about 50 µs on a 2-vCPU AMD EPYC, long
/// enough to catch the next call of a forward pass (no process alone got slower, below) and
/// short enough that a worker whose caller was descheduled gives the core back soon. Measured
/// there (the `bench` example, 2 threads, 512-token scoring, 64-token generation and the prefix
/// jobs): one process alone took 21.6–23.0 s either way, two side by side 39.8–40.2 s against
/// 46.7–47.7 s with 20,000 (about 500 µs), which spent one core's slices spinning while the
/// other process needed it — the test suite, the demo's six engines and any reference sharing
/// its cores run that way.
const SPIN: u32 = 2_000;

type Job = dyn Fn(Range<usize>) + Sync;

/// The current job: the closure, the item count and the chunk count.
#[derive(Clone, Copy)]
struct JobRef {
    f: *const Job,
    n: usize,
    chunks: usize,
}
// SAFETY: the closure is `Sync` and outlives every use (see `Pool::for_chunks`).
unsafe impl Send for JobRef {}

struct Shared {
    /// Incremented for every job; workers look for work when they see a new value.
    generation: AtomicU64,
    /// Next chunk to claim.
    next: AtomicUsize,
    /// Workers that registered for the current job and have not finished with it.
    active: AtomicUsize,
    /// Set if a job panicked in a worker.
    panicked: AtomicBool,
    /// The current job; None once the caller no longer accepts helpers.
    job: Mutex<Option<JobRef>>,
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
    /// Serialises calls from different threads.
    running: Mutex<()>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads)
            .finish()
    }
}

/// Claims and runs chunks until none is left.
fn drain(shared: &Shared, job: JobRef) {
    // SAFETY: the caller of `for_chunks` keeps the closure alive until every registered
    // participant has left (`active` back to zero), and this runs only while registered
    // (or on the caller itself).
    let f = unsafe { &*job.f };
    loop {
        let c = shared.next.fetch_add(1, Ordering::AcqRel);
        if c >= job.chunks {
            return;
        }
        f(split(job.n, c, job.chunks));
    }
}

impl Pool {
    /// Starts `threads - 1` workers (at least one thread in all).
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            next: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
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
                    .spawn(move || worker(&shared))
            })
            .filter_map(std::result::Result::ok)
            .collect::<Vec<_>>();
        // if the OS refused a thread, run with the ones we got
        let threads = workers.len() + 1;
        Self {
            threads,
            shared,
            workers,
            running: Mutex::new(()),
        }
    }

    /// Number of threads, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` over contiguous chunks covering `0..n` (about `per_thread` chunks per
    /// thread), on the caller and the workers; returns when all chunks are done.
    pub fn for_chunks(&self, n: usize, per_thread: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
        if n == 0 {
            return;
        }
        let chunks = (self.threads * per_thread.max(1)).min(n);
        if self.threads == 1 || chunks == 1 {
            f(0..n);
            return;
        }
        let _guard = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // SAFETY: the lifetime is erased only while this call blocks: we return only after
        // the job is withdrawn and every worker that took it has left.
        let ptr: *const Job = unsafe {
            std::mem::transmute::<*const (dyn Fn(Range<usize>) + Sync + '_), *const Job>(f)
        };
        let job = JobRef { f: ptr, n, chunks };
        {
            let mut slot = self
                .shared
                .job
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.shared.next.store(0, Ordering::SeqCst);
            *slot = Some(job);
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
        }
        self.shared.wake.notify_all();
        drain(&self.shared, job);
        // withdraw the job: late workers find nothing; registered ones finish their chunk
        *self
            .shared
            .job
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        let mut spins = 0u32;
        while self.shared.active.load(Ordering::Acquire) != 0 {
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

fn worker(shared: &Shared) {
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
                let job = shared
                    .job
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if shared.generation.load(Ordering::Acquire) == seen
                    && !shared.shutdown.load(Ordering::Acquire)
                {
                    drop(
                        shared
                            .wake
                            .wait(job)
                            .unwrap_or_else(std::sync::PoisonError::into_inner),
                    );
                }
            }
        }
        // register under the lock, so the caller cannot withdraw the job in between
        let job = {
            let slot = shared
                .job
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            seen = shared.generation.load(Ordering::Acquire);
            if slot.is_some() {
                shared.active.fetch_add(1, Ordering::AcqRel);
            }
            *slot
        };
        if let Some(job) = job {
            if catch_unwind(AssertUnwindSafe(|| drain(shared, job))).is_err() {
                shared.panicked.store(true, Ordering::SeqCst);
            }
            shared.active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _job = self
                .shared
                .job
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The half-open range of `0..n` that part `t` of `parts` covers (contiguous, balanced).
pub fn split(n: usize, t: usize, parts: usize) -> Range<usize> {
    (n * t / parts)..(n * (t + 1) / parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_exactly_once_per_call() {
        let pool = Pool::new(3);
        assert_eq!(pool.threads(), 3);
        let hits: Vec<AtomicUsize> = (0..97).map(|_| AtomicUsize::new(0)).collect();
        for round in 0..500 {
            let n = 1 + round % 97;
            pool.for_chunks(n, 4, &|r| {
                for i in r {
                    hits[i].fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        let want: Vec<usize> = (0..97)
            .map(|i| (0..500).filter(|round| i < 1 + round % 97).count())
            .collect();
        let got: Vec<usize> = hits.iter().map(|h| h.load(Ordering::SeqCst)).collect();
        assert_eq!(got, want);
    }
}
