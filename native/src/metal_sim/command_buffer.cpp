// metal-sim's device buffers and command buffers (command_buffer.h).
#include "metal_sim/command_buffer.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/backend.h"

namespace mfa::sim {

namespace {
constexpr size_t kBufferAlignment = 64;
} // namespace

mfa_status buffer_create(size_t length, Buffer** out) {
    *out = nullptr;
    // aligned_alloc wants a multiple of the alignment; the rest of the last block is unused.
    const size_t rounded = (length + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
    void* contents = rounded >= length ? std::aligned_alloc(kBufferAlignment, rounded) : nullptr;
    auto* buffer = contents ? new (std::nothrow) Buffer : nullptr;
    if (!buffer) {
        std::free(contents);
        return mfa_set_error(MFA_ERROR_OUT_OF_MEMORY,
                             "metal-sim: cannot allocate a device buffer of %zu bytes", length);
    }
    std::memset(contents, 0, rounded);
    buffer->tag = kBufferTag;
    buffer->length = length;
    buffer->contents = contents;
    *out = buffer;
    return MFA_OK;
}

Buffer* buffer_of(void* handle) {
    auto* buffer = static_cast<Buffer*>(handle);
    return buffer != nullptr && buffer->tag == kBufferTag ? buffer : nullptr;
}

void buffer_destroy(Buffer* buffer) {
    buffer->tag = 0;
    std::free(buffer->contents);
    delete buffer;
}

CommandBuffer::~CommandBuffer() { finish_all(head_, head_); }

// Tells every piece of work from head on whether it ran (those before failed_from did) and
// deletes it.
void CommandBuffer::finish_all(EncodedWork* head, EncodedWork* failed_from) {
    bool ran = head != failed_from;
    for (EncodedWork* work = head; work != nullptr;) {
        if (work == failed_from) ran = false;
        EncodedWork* next = work->next_;
        work->completed(ran);
        delete work;
        work = next;
    }
}

mfa_status CommandBuffer::check_encoding(const char* what) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ == State::Encoding) return MFA_OK;
    return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                         "metal-sim: %s: the command buffer was already committed; encode into a "
                         "new one",
                         what);
}

mfa_status CommandBuffer::append(EncodedWork* work, const char* what) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ != State::Encoding) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal-sim: %s: the command buffer was committed while the call "
                             "was encoding into it",
                             what);
    }
    work->next_ = nullptr;
    (tail_ ? tail_->next_ : head_) = work;
    tail_ = work;
    return MFA_OK;
}

mfa_status CommandBuffer::commit() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ != State::Encoding) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal-sim: mfa_command_buffer_commit: the command buffer was "
                             "already committed");
    }
    EncodedWork* failed = nullptr;
    for (EncodedWork* work = head_; work != nullptr; work = work->next_) {
        const mfa_status status = work->run();
        if (status != MFA_OK) {
            status_ = status;
            std::snprintf(message_, sizeof message_, "%s", mfa_last_error());
            failed = work;
            break;
        }
    }
    finish_all(head_, failed);
    head_ = tail_ = nullptr;
    state_ = State::Completed;
    return MFA_OK;
}

mfa_status CommandBuffer::wait() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ == State::Encoding) {
        return mfa_set_error(MFA_ERROR_INVALID_ARGUMENT,
                             "metal-sim: mfa_command_buffer_wait: the command buffer was never "
                             "committed (mfa_command_buffer_commit)");
    }
    if (status_ == MFA_OK) return MFA_OK;
    return mfa_set_error(status_, "%s", message_);
}

} // namespace mfa::sim
