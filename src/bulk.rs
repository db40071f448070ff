//! Bulk work, off the serving threads: a large batch is parsed and applied on a thread of its
//! own (at nice [`BULK_NICE`]), so that single heartbeats never wait behind it in a serving
//! thread's event loop (issue 27, part 3).
//!
//! Why threads and not tasks: a serving thread is one event loop (`placement`). With batches
//! applied on it, 64 items at a time between yields, a single heartbeat on the same thread
//! waited for the loop to come round and, on a busy machine, for the kernel to give the loop
//! its core back: during a 1M-key batch registration on 2 cores, singles measured p50 1.3-2.1
//! ms and p99 6.4-18 ms (BENCHMARKS.md, "Single heartbeats beside bulk threads"). Smaller
//! chunks helped little (p99 5.1-10.3 ms with 16 items): the loop was runnable but not running.
//! A serving thread that only reads requests, applies small ones and writes answers sleeps most
//! of the time, and the kernel runs a thread that wakes from a short sleep soon, ahead of a
//! running one that has used its share.
//!
//! Invariants: every job sent runs once, whole, on one bulk thread, with the sender's runtime
//! entered (tokio's clock, paused or not, and its handles work in it); its result goes back to
//! the sender (one that gave up drops it); a job that panics loses only its result; dropping
//! [`Bulk`] lets the threads finish the jobs already queued, then stop.

use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// The bulk threads' nice value: the serving threads' own. At nice 5 (the first choice) the
/// singles' latency during a 1M-key batch registration was the same (p99 1.8-3.6 ms, against
/// 2.3-3.7 at nice 0), but batched creations on a single node with persistence lost a fifth of
/// their rate (78-93k/s against 123-126k/s at nice 0 and 125-148k/s before bulk threads): on 2
/// cores a nice-5 thread gets about a third of a nice-0 one's share of a contended core
/// (BENCHMARKS.md, "Single heartbeats beside bulk threads").
pub const BULK_NICE: i32 = 0;

type Job = Box<dyn FnOnce() + Send>;

/// Threads that run bulk jobs. See the module documentation.
pub struct Bulk {
    jobs: Option<mpsc::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Bulk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bulk")
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

impl Bulk {
    /// Starts `threads` bulk threads (at least one), named `ttlwheel-bulk-N`.
    pub fn start(threads: usize) -> io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        let threads = (0..threads.max(1))
            .map(|index| {
                let queue = Arc::clone(&queue);
                std::thread::Builder::new()
                    .name(format!("ttlwheel-bulk-{index}"))
                    .spawn(move || run_jobs(&queue))
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self {
            jobs: Some(jobs),
            threads,
        })
    }

    /// Runs `job` on a bulk thread; its result, or `None` if it panicked or the threads have
    /// stopped.
    pub async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (done, result) = oneshot::channel();
        let runtime = tokio::runtime::Handle::current();
        let job: Job = Box::new(move || {
            let _entered = runtime.enter();
            if let Ok(value) = std::panic::catch_unwind(AssertUnwindSafe(job)) {
                let _ = done.send(value);
            }
        });
        self.jobs.as_ref()?.send(job).ok()?;
        result.await.ok()
    }
}

impl Drop for Bulk {
    /// Closes the queue and waits for the threads to finish what it holds.
    fn drop(&mut self) {
        self.jobs = None;
        for thread in self.threads.drain(..) {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// A bulk thread: sets its priority to [`BULK_NICE`], then runs jobs until the queue closes.
fn run_jobs(queue: &Mutex<mpsc::Receiver<Job>>) {
    lower_priority(BULK_NICE);
    loop {
        let job = queue.lock().recv();
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

/// Sets this thread's nice value to `nice` (bulk threads: [`BULK_NICE`]; the snapshot writer
/// too). On Linux the nice value is a thread's own (`setpriority(2)`, NOTES: it is named by the
/// thread id), and raising it needs no privilege; where it fails the thread runs at normal
/// priority, as the serving threads do.
pub fn lower_priority(nice: i32) {
    let this_thread = Some(rustix::thread::gettid());
    if let Err(error) = rustix::process::setpriority_process(this_thread, nice) {
        tracing::debug!(%error, "a background thread runs at normal priority");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A job sees its sender's tokio clock, paused and moved on here: deadlines live on that
    /// clock, whichever thread reads it.
    #[tokio::test(start_paused = true)]
    async fn a_job_runs_on_a_bulk_thread_with_the_senders_clock() {
        let bulk = Bulk::start(2).unwrap();
        tokio::time::advance(Duration::from_secs(3_600)).await;
        let here = tokio::time::Instant::now();
        let (there, thread) = bulk
            .run(|| {
                let name = std::thread::current().name().map(str::to_owned);
                (tokio::time::Instant::now(), name)
            })
            .await
            .expect("its result");
        assert_eq!(there, here, "the paused clock, not the wall's");
        assert!(thread.is_some_and(|name| name.starts_with("ttlwheel-bulk-")));
    }

    /// The threads run at [`BULK_NICE`]; [`lower_priority`] (the snapshot writer's) changes
    /// only the calling thread's priority; a job that panics loses only its result.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_thread_lowers_only_its_own_priority_and_survives_a_panicking_job() {
        let nice = || rustix::process::getpriority_process(Some(rustix::thread::gettid()));
        let mine = nice().unwrap();
        let bulk = Bulk::start(1).unwrap();
        let panicked: Option<()> = bulk.run(|| panic!("a job that fails")).await;
        assert_eq!(panicked, None);
        let theirs = bulk.run(move || nice().unwrap()).await;
        assert_eq!(theirs, Some(BULK_NICE), "the same thread, still running");
        let lowered = bulk
            .run(move || {
                lower_priority(10);
                nice().unwrap()
            })
            .await;
        assert_eq!(lowered, Some(10));
        assert_eq!(nice().unwrap(), mine, "the caller's priority is untouched");
    }

    /// Dropping the pool finishes the jobs already queued.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_pool_finishes_the_queued_jobs_and_stops_the_threads() {
        let bulk = Bulk::start(1).unwrap();
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let pending: Vec<_> = (0..10)
            .map(|_| {
                let ran = Arc::clone(&ran);
                let job = move || {
                    std::thread::sleep(Duration::from_millis(5));
                    ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                };
                let (done, result) = oneshot::channel();
                let job: Job = Box::new(move || {
                    job();
                    let _ = done.send(());
                });
                bulk.jobs.as_ref().unwrap().send(job).unwrap();
                result
            })
            .collect();
        drop(bulk);
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 10);
        for result in pending {
            assert!(result.await.is_ok());
        }
    }
}
