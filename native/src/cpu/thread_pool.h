/*
 * A persistent pool of worker threads shared by every call on one context.
 *
 * Each call submits its own job and waits for that job only, so concurrent calls on one context
 * never wait for each other's work or mix their tasks. The calling thread works on its own job
 * too: a job always makes progress even while every worker is busy with other callers' jobs,
 * which is what rules out deadlock.
 */
#ifndef MFA_CPU_THREAD_POOL_H
#define MFA_CPU_THREAD_POOL_H

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace mfa_cpu {

class ThreadPool {
  public:
    /* Runs tasks on `threads` threads in all: threads - 1 workers plus the caller. Throws
     * std::system_error if a worker cannot be started. */
    explicit ThreadPool(int threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    /* Threads that may run a job's tasks at once: task(i, slot) is given slot < threads(), and no
     * two tasks of one job run with the same slot at the same time. */
    int threads() const { return static_cast<int>(workers_.size()) + 1; }

    typedef void (*Task)(void* context, int64_t index, int slot);
    /* Runs task(context, i, slot) for every i in [0, count) and returns when all have finished.
     * Tasks must not throw. */
    void run(int64_t count, Task task, void* context);

  private:
    struct Job {
        Task task;
        void* context;
        int64_t count;
        int64_t next = 0;
        int64_t finished = 0;
    };

    void work(int slot);
    void stop();
    /* Claims the next index of job, or returns false once all are claimed. Needs mutex_. */
    static bool claim(Job& job, int64_t& index);

    std::mutex mutex_;
    std::condition_variable work_available_;
    std::condition_variable job_finished_;
    std::deque<Job*> jobs_; /* jobs with unclaimed tasks, oldest first */
    bool stopping_ = false;
    std::vector<std::thread> workers_;
};

} // namespace mfa_cpu

#endif /* MFA_CPU_THREAD_POOL_H */
