/*
 * A persistent pool of worker threads shared by every call on one context.
 *
 * Each call submits its own job and waits for that job only, so concurrent calls on one context
 * never wait for each other's work or mix their tasks. The calling thread works on its own job
 * too: a job always makes progress even while every worker is busy with other callers' jobs,
 * which is what rules out deadlock.
 *
 * fork(): a pool may be used in the child of a fork() made while other threads were inside
 * calls on it. Around every fork the pool's lock is taken (pthread_atfork), so the child gets it
 * in a consistent state; the child then forgets the parent's workers and jobs (their threads do
 * not exist there) and starts new workers on its first call.
 */
#ifndef MFA_CPU_THREAD_POOL_H
#define MFA_CPU_THREAD_POOL_H

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "core/fork_registry.h"

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
    int threads() const { return threads_; }

    typedef void (*Task)(void* context, int64_t index, int slot);
    /* Runs task(context, i, slot) for every i in [0, count) and returns when all have finished.
     * Tasks must not throw. */
    void run(int64_t count, Task task, void* context);

  private:
    friend class mfa::ForkRegistry<ThreadPool>;

    struct Job {
        Task task;
        void* context;
        int64_t count;
        int64_t next = 0;
        int64_t finished = 0;
    };

    void work(int slot);
    void stop();
    /* Starts the workers that are missing (all of them, or after a fork). Needs mutex_. Throws
     * std::system_error when one cannot be started. */
    void start_workers();
    /* Claims the next index of job, or returns false once all are claimed. Needs mutex_. */
    static bool claim(Job& job, int64_t& index);
    /* In a fork child: no jobs and no workers (their threads stayed in the parent). */
    void reset_in_fork_child();

    const int threads_;
    std::mutex mutex_;
    std::condition_variable work_available_;
    std::condition_variable job_finished_;
    std::deque<Job*> jobs_; /* jobs with unclaimed tasks, oldest first */
    bool stopping_ = false;
    bool forked_ = false; /* in a fork child whose workers have not been started again yet */
    std::vector<std::thread> workers_;
    ThreadPool* next_ = nullptr; /* the process's list of pools, for fork() */
    ThreadPool* prev_ = nullptr;
};

} // namespace mfa_cpu

#endif /* MFA_CPU_THREAD_POOL_H */
