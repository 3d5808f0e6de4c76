/* The process's list of live objects of one kind (the cpu backend's thread pools, metal-sim's
 * fiber stack pools and scratch pools), so that a fork() finds each one consistent: the prepare
 * handler takes the list's lock and every object's mutex_ (held only briefly, never while work
 * runs), the parent's handler gives them back, and the child's has each object make itself fresh
 * with reset_in_fork_child() (which must also make mutex_ a new, unlocked mutex: the threads
 * behind whatever the parent had locked or was waiting on stayed in the parent), then makes its
 * own lock anew. Allocated once and never destroyed, so that objects destroyed during static
 * destruction still find it.
 *
 * C++ only. T befriends ForkRegistry<T>, has members mutex_, next_ and prev_ (T*, null before
 * add()), calls add(this) once constructed and remove(this) first when destroyed. */
#ifndef MFA_CORE_FORK_REGISTRY_H
#define MFA_CORE_FORK_REGISTRY_H

#include <pthread.h>

#include <mutex>
#include <new>

namespace mfa {

template <typename T>
class ForkRegistry {
  public:
    static void add(T* object) {
        ForkRegistry& r = instance();
        std::lock_guard<std::mutex> lock(r.mutex_);
        object->next_ = r.first_;
        if (object->next_) object->next_->prev_ = object;
        r.first_ = object;
    }

    static void remove(T* object) {
        ForkRegistry& r = instance();
        std::lock_guard<std::mutex> lock(r.mutex_);
        (object->prev_ ? object->prev_->next_ : r.first_) = object->next_;
        if (object->next_) object->next_->prev_ = object->prev_;
    }

  private:
    std::mutex mutex_;
    T* first_ = nullptr;

    static ForkRegistry& instance() {
        static ForkRegistry* registry = [] {
            auto* r = new ForkRegistry;
            pthread_atfork(&prepare_fork, &after_fork_in_parent, &after_fork_in_child);
            return r;
        }();
        return *registry;
    }

    static void prepare_fork() {
        ForkRegistry& r = instance();
        r.mutex_.lock();
        for (T* object = r.first_; object; object = object->next_) object->mutex_.lock();
    }

    static void after_fork_in_parent() {
        ForkRegistry& r = instance();
        for (T* object = r.first_; object; object = object->next_) object->mutex_.unlock();
        r.mutex_.unlock();
    }

    /* Reusing the storage of a locked mutex without running its destructor is well defined. */
    static void after_fork_in_child() {
        ForkRegistry& r = instance();
        for (T* object = r.first_; object; object = object->next_) object->reset_in_fork_child();
        new (&r.mutex_) std::mutex;
    }
};

} // namespace mfa

#endif
