#include "cpu/thread_pool.h"

#include <algorithm>
#include <new>

#if defined(__linux__)
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace mfa_cpu {

namespace {

/* The CPU's hint that this thread is waiting in a loop: the other hardware thread of the core
 * runs meanwhile, and leaving the loop does not mispredict. */
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Returns once done() is true or `limit` has passed, checking it between pause hints. */
template <class Done>
void spin_until(Done done, std::chrono::microseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
        for (int i = 0; i < 8; ++i) {
            if (done()) return;
            cpu_relax();
        }
        if (std::chrono::steady_clock::now() >= until) return;
    }
}

#if defined(__linux__)
/* The CPUs the calling thread may run on, ascending; empty if they cannot be read. Counted
 * first, so that the list is one allocation and starting a pool frees nothing. */
std::vector<int> allowed_cpus() {
    std::vector<int> cpus;
    cpu_set_t set; /* CPU_SETSIZE (1024) CPUs; a machine with more reads none, so no placement */
    if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
    cpus.reserve(static_cast<size_t>(CPU_COUNT(&set)));
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
        if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
    return cpus;
}

/* `mask` (room for CPUs up to cpus.back()) set to `cpus` but `left_out`. */
void fill_mask(std::vector<unsigned long>& mask, const std::vector<int>& cpus, int left_out) {
    cpu_set_t* set = reinterpret_cast<cpu_set_t*>(mask.data());
    const size_t bytes = mask.size() * sizeof(mask[0]);
    CPU_ZERO_S(bytes, set);
    for (int cpu : cpus)
        if (cpu != left_out) CPU_SET_S(cpu, bytes, set);
}

/* Best effort: a cpuset changed since the pool started may refuse the mask; the thread then
 * keeps its affinity and the job still runs, only maybe packed. */
void set_affinity(long tid, const std::vector<unsigned long>& mask) {
    (void)sched_setaffinity(static_cast<pid_t>(tid), mask.size() * sizeof(mask[0]),
                            reinterpret_cast<const cpu_set_t*>(mask.data()));
}
#endif

} // namespace

ThreadPool::ThreadPool(int threads) : threads_(std::max(threads, 1)) {
    workers_.reserve(static_cast<size_t>(threads_ - 1));
    worker_tids_.assign(static_cast<size_t>(threads_ - 1), 0);
    placed_.assign(static_cast<size_t>(threads_ - 1), 0);
#if defined(__linux__)
    cpus_ = allowed_cpus();
    if (cpus_.size() >= 2) {
        /* Both masks made here: a worker's first allocation would give it a malloc arena of its
         * own (tens of MiB of address space per thread). */
        const size_t words = CPU_ALLOC_SIZE(cpus_.back() + 1) / sizeof(unsigned long);
        placement_mask_.assign(words, 0);
        all_cpus_mask_.assign(words, 0);
        fill_mask(all_cpus_mask_, cpus_, -1);
    }
#endif
    try {
        start_workers();
    } catch (...) {
        stop();
        throw;
    }
    mfa::ForkRegistry<ThreadPool>::add(this);
}

ThreadPool::~ThreadPool() {
    mfa::ForkRegistry<ThreadPool>::remove(this);
    stop();
}

/* Fresh objects over the parent's (reusing storage without running destructors is well
 * defined): a std::thread of a thread that does not exist here must never be joined, and a
 * condition variable must not keep the parent's waiters. */
void ThreadPool::reset_in_fork_child() {
    for (std::thread& worker : workers_) new (&worker) std::thread();
    workers_.clear();
    jobs_.clear();
    std::fill(worker_tids_.begin(), worker_tids_.end(), 0);
    std::fill(placed_.begin(), placed_.end(), 0);
    queued_jobs_ = 0;
    forked_ = true;
    new (&work_available_) std::condition_variable;
    new (&job_finished_) std::condition_variable;
    new (&mutex_) std::mutex;
}

void ThreadPool::start_workers() {
    for (int slot = static_cast<int>(workers_.size()); slot + 1 < threads_; ++slot)
        workers_.emplace_back(&ThreadPool::work, this, slot);
}

void ThreadPool::stop() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    work_available_.notify_all();
    for (std::thread& worker : workers_) worker.join();
    workers_.clear();
}

void ThreadPool::keep_workers_off(int cpu) {
#if defined(__linux__)
    if (cpu < 0 || placement_mask_.empty()) return;
    fill_mask(placement_mask_, cpus_, cpu);
    for (size_t worker = 0; worker < worker_tids_.size(); ++worker) {
        if (worker_tids_[worker] <= 0) continue; /* not started yet; 0 would be this thread */
        set_affinity(worker_tids_[worker], placement_mask_);
        placed_[worker] = 1;
    }
#else
    (void)cpu;
#endif
}

bool ThreadPool::claim(Job& job, int64_t& index) {
    if (job.next >= job.count) return false;
    index = job.next++;
    return true;
}

void ThreadPool::work(int slot) {
    std::unique_lock<std::mutex> lock(mutex_);
#if defined(__linux__)
    worker_tids_[static_cast<size_t>(slot)] = static_cast<long>(syscall(SYS_gettid));
#endif
    for (;;) {
        work_available_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (stopping_) return;
        Job& job = *jobs_.front();
        int64_t index;
        if (!claim(job, index)) {
            jobs_.pop_front();
            continue;
        }
#if defined(__linux__)
        const bool placed = placed_[static_cast<size_t>(slot)] != 0;
        placed_[static_cast<size_t>(slot)] = 0;
#endif
        lock.unlock();
        job.task(job.context, index, slot);
#if defined(__linux__)
        /* Its first task has run off the caller's CPU: the scheduler may move it freely again. */
        if (placed) set_affinity(0, all_cpus_mask_);
#endif
        lock.lock();
        if (++job.finished == job.count) job_finished_.notify_all();
    }
}

void ThreadPool::run(int64_t count, Task task, void* context) {
    if (count <= 0) return;
    const int caller_slot = threads_ - 1;
    Job job;
    job.task = task;
    job.context = context;
    job.count = count;
    std::unique_lock<std::mutex> lock(mutex_);
    if (forked_) {
        /* The first call in a fork child. Workers that cannot be started leave their share to
         * the callers: every job still finishes, on fewer threads. */
        forked_ = false;
        try {
            start_workers();
        } catch (const std::system_error&) {}
    }
    const bool shared = !workers_.empty() && count > 1;
    if (shared) {
#if defined(__linux__)
        if (queued_jobs_ == 0 && std::chrono::steady_clock::now() - idle_since_ >= kPlacementPause)
            keep_workers_off(sched_getcpu());
#endif
        ++queued_jobs_;
        jobs_.push_back(&job);
        work_available_.notify_all();
    }
    int64_t index;
    while (claim(job, index)) {
        lock.unlock();
        task(context, index, caller_slot);
        lock.lock();
        ++job.finished;
    }
    /* All indices are claimed; the job may still be queued if no worker has seen that yet. */
    jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), &job), jobs_.end());
    if (job.finished != job.count) {
        /* The lock is taken again after the spin: the worker that counts the last task holds it
         * until it no longer touches the job, which lives on this stack. */
        lock.unlock();
        spin_until([&job] { return job.finished.load(std::memory_order_acquire) == job.count; },
                   kCallerSpin);
        lock.lock();
    }
    job_finished_.wait(lock, [&job] { return job.finished == job.count; });
    if (shared && --queued_jobs_ == 0) idle_since_ = std::chrono::steady_clock::now();
}

} // namespace mfa_cpu
