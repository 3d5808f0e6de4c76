#include "cpu/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <new>

namespace mfa_cpu {

/* Every live pool, so that a fork() finds each one consistent: the prepare handler takes every
 * pool's lock (held only briefly, never while a task runs), the parent's handler gives them back,
 * and the child's makes them fresh and unlocked, with no jobs and no workers (the threads behind
 * both stayed in the parent). Allocated once and never destroyed, so that pools destroyed during
 * static destruction still find it. */
struct ThreadPoolRegistry {
    std::mutex mutex;
    ThreadPool* first = nullptr;

    static ThreadPoolRegistry& instance() {
        static ThreadPoolRegistry* registry = [] {
            auto* r = new ThreadPoolRegistry;
            pthread_atfork(&prepare_fork, &after_fork_in_parent, &after_fork_in_child);
            return r;
        }();
        return *registry;
    }

    static void prepare_fork() {
        ThreadPoolRegistry& r = instance();
        r.mutex.lock();
        for (ThreadPool* pool = r.first; pool; pool = pool->next_) pool->mutex_.lock();
    }

    static void after_fork_in_parent() {
        ThreadPoolRegistry& r = instance();
        for (ThreadPool* pool = r.first; pool; pool = pool->next_) pool->mutex_.unlock();
        r.mutex.unlock();
    }

    /* Fresh objects over the parent's (reusing storage without running destructors is well
     * defined): a std::thread of a thread that does not exist here must never be joined, and a
     * condition variable must not keep the parent's waiters. */
    static void after_fork_in_child() {
        ThreadPoolRegistry& r = instance();
        for (ThreadPool* pool = r.first; pool; pool = pool->next_) {
            for (std::thread& worker : pool->workers_) new (&worker) std::thread();
            pool->workers_.clear();
            pool->jobs_.clear();
            pool->forked_ = true;
            new (&pool->work_available_) std::condition_variable;
            new (&pool->job_finished_) std::condition_variable;
            new (&pool->mutex_) std::mutex;
        }
        new (&r.mutex) std::mutex;
    }
};

ThreadPool::ThreadPool(int threads) : threads_(std::max(threads, 1)) {
    workers_.reserve(static_cast<size_t>(threads_ - 1));
    try {
        start_workers();
    } catch (...) {
        stop();
        throw;
    }
    ThreadPoolRegistry& r = ThreadPoolRegistry::instance();
    std::lock_guard<std::mutex> lock(r.mutex);
    next_ = r.first;
    if (next_) next_->prev_ = this;
    r.first = this;
}

ThreadPool::~ThreadPool() {
    {
        ThreadPoolRegistry& r = ThreadPoolRegistry::instance();
        std::lock_guard<std::mutex> lock(r.mutex);
        (prev_ ? prev_->next_ : r.first) = next_;
        if (next_) next_->prev_ = prev_;
    }
    stop();
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

bool ThreadPool::claim(Job& job, int64_t& index) {
    if (job.next >= job.count) return false;
    index = job.next++;
    return true;
}

void ThreadPool::work(int slot) {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        work_available_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (stopping_) return;
        Job& job = *jobs_.front();
        int64_t index;
        if (!claim(job, index)) {
            jobs_.pop_front();
            continue;
        }
        lock.unlock();
        job.task(job.context, index, slot);
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
    if (!workers_.empty() && count > 1) {
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
    job_finished_.wait(lock, [&job] { return job.finished == job.count; });
}

} // namespace mfa_cpu
