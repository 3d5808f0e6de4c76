/*
 * A persistent pool of worker threads shared by every call on one context.
 *
 * Each call submits its own job and waits for that job only, so concurrent calls on one context
 * never wait for each other's work or mix their tasks. The calling thread works on its own job
 * too: a job always makes progress even while every worker is busy with other callers' jobs,
 * which is what rules out deadlock.
 *
 * Placement (Linux): a job that follows an idle pause starts with the workers held off the
 * caller's CPU. The caller wakes the sleeping workers, and a scheduler that saves power while
 * the machine is lightly loaded may queue a woken worker on the waker's CPU, behind the caller,
 * rather than wake an idle CPU for it; the job then runs on one CPU until load balancing moves
 * the worker, which can take milliseconds (some virtual machines' kernels pack threads so after
 * every idle pause of >= 15 ms: calls of a few milliseconds after a pause ran on one thread).
 * So when no job has run for kPlacementPause, the caller narrows each worker's affinity to the
 * pool's CPUs (those the workers started with: a taskset or cgroup cpuset is kept) minus the
 * CPU it runs on (sched_getcpu) before it wakes them, and each worker gives itself all the
 * pool's CPUs back once it has run its first task of the job. Only that first job is placed,
 * and only until each worker's first task: where another process keeps the other CPUs busy,
 * the scheduler's packing is the better choice, and workers held off the caller's CPU for
 * whole jobs, or for every job of a call, made calls of many passes 10-20 % slower. The
 * caller's own affinity is never touched. The cost is one sched_setaffinity (about 1 us) per
 * worker from the caller and one from each worker, after idle pauses only: calls in a row make
 * none. Only a caller alone on the pool places the workers, and not where the pool has a single
 * CPU.
 *
 * The caller's short spin. A caller that has claimed its job's last task waits for the workers'
 * last tasks: it watches the job's count with the CPU's pause hint for up to kCallerSpin before
 * it sleeps on the condition variable. Woken from sleep, it would wait tens of microseconds more
 * on a virtual machine, whose halted CPU the wake-up has to restart, which is a large part of a
 * call of a hundred (decoding a short cache, small heads); the spin costs nothing the caller
 * could have used, as the call holds it until the job ends. Measured on a 2-core Emerald
 * Rapids KVM guest, decoding calls in a row (Hq 32, Hkv 8, D 128, f32 and bf16), each way round
 * against the build without it: 13-15 % faster at Nk 128, 3 % at 512, unchanged at 2048.
 * Workers do not spin: idle workers that spin between calls made such loops up to 16 % faster
 * still, but a model's own operators between the calls (torch's threads on the same cores) then
 * ran 5 % slower. Nor do they spin between the passes of one call (packing, then the products),
 * where a woken worker can be packed onto the caller's CPU too: spinning there for the next pass
 * for up to 1 ms made forward calls after 50 ms pauses 1.3-1.8x faster on a 2-core AMD EPYC
 * (Zen 4) KVM guest, but a loop of a torch matmul and an mfa forward call 16-34 % slower (B 1,
 * N 1024 causal; at B 8, N 256, noisier, 5-57 %), with a spin of 1 ms as with one of 50 us
 * (torch's threads spin after their own work on the same two CPUs).
 *
 * fork(): a pool may be used in the child of a fork() made while other threads were inside
 * calls on it. Around every fork the pool's lock is taken (pthread_atfork), so the child gets it
 * in a consistent state; the child then forgets the parent's workers and jobs (their threads do
 * not exist there) and starts new workers on its first call.
 */
#ifndef MFA_CPU_THREAD_POOL_H
#define MFA_CPU_THREAD_POOL_H

#include <atomic>
#include <chrono>
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
        /* Counted under mutex_; read without it by the caller's spin (header comment). */
        std::atomic<int64_t> finished{0};
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
    /* Keeps the started workers off `cpu` until each has run a task (header comment:
     * placement). Needs mutex_. Linux only; elsewhere nothing. */
    void keep_workers_off(int cpu);

    const int threads_;
    std::mutex mutex_;
    std::condition_variable work_available_;
    std::condition_variable job_finished_;
    std::deque<Job*> jobs_; /* jobs with unclaimed tasks, oldest first */
    /* How long a caller waiting for its job's last tasks spins before it sleeps (header
     * comment: the caller's short spin). */
    static constexpr std::chrono::microseconds kCallerSpin{100};
    bool stopping_ = false;
    bool forked_ = false; /* in a fork child whose workers have not been started again yet */
    std::vector<std::thread> workers_;
    /* Placement. Each worker's kernel thread id (0 until it has started) and whether it is held
     * off the caller's CPU; the CPUs the workers started with, as a list and as a mask, and the
     * mask that keeps them off one (needs mutex_); the jobs queued and not yet finished, and
     * when the last one finished. */
    static constexpr std::chrono::milliseconds kPlacementPause{1};
    std::vector<long> worker_tids_;
    std::vector<char> placed_;
    std::vector<int> cpus_;
    std::vector<unsigned long> all_cpus_mask_;
    std::vector<unsigned long> placement_mask_;
    int64_t queued_jobs_ = 0;
    std::chrono::steady_clock::time_point idle_since_{};
    ThreadPool* next_ = nullptr; /* the process's list of pools, for fork() */
    ThreadPool* prev_ = nullptr;
};

} // namespace mfa_cpu

#endif /* MFA_CPU_THREAD_POOL_H */
