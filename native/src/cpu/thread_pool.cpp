#include "cpu/thread_pool.h"

#include <algorithm>

namespace mfa_cpu {

ThreadPool::ThreadPool(int threads) {
    workers_.reserve(threads > 1 ? threads - 1 : 0);
    try {
        for (int slot = 0; slot + 1 < threads; ++slot)
            workers_.emplace_back(&ThreadPool::work, this, slot);
    } catch (...) {
        stop();
        throw;
    }
}

ThreadPool::~ThreadPool() { stop(); }

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
    const int caller_slot = threads() - 1;
    Job job;
    job.task = task;
    job.context = context;
    job.count = count;
    std::unique_lock<std::mutex> lock(mutex_);
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
