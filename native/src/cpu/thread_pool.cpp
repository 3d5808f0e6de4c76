#include "cpu/thread_pool.h"

#include <algorithm>
#include <new>

namespace mfa_cpu {

ThreadPool::ThreadPool(int threads) : threads_(std::max(threads, 1)) {
    workers_.reserve(static_cast<size_t>(threads_ - 1));
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
