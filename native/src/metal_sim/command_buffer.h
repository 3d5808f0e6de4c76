// metal-sim's device memory and command buffers, as mfa.h's mfa_buffer_* and
// mfa_command_buffer_* give them to callers: what MTLBuffer and MTLCommandBuffer are to the
// Metal backend.
//
// A Buffer is host memory behind a handle, so that device arrays on metal-sim are bound exactly
// as on Metal: a handle plus a byte offset, bounded by the length the handle reports. A
// CommandBuffer records the work encoded into it (each mfa_attention_encode: its dispatches)
// and runs it in encoding order when committed, as a GPU runs a committed command buffer; its
// status is kept for mfa_command_buffer_wait. Every encoded piece of work is told exactly once
// whether it ran to completion: when its command buffer ran it, or when the command buffer is
// destroyed without being committed (the work is dropped). That is when a call gives its
// scratch back.
//
// Thread safety: a command buffer locks itself, so commit, wait and destroy may come from any
// thread; encodes into different command buffers never share state here. Commit runs the work
// on the committing thread (with the simulator's worker threads): metal-sim's commit returns
// once the work has run, which a caller of the asynchronous Metal commit may not rely on.
#ifndef MFA_METAL_SIM_COMMAND_BUFFER_H
#define MFA_METAL_SIM_COMMAND_BUFFER_H

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "mfa.h"

namespace mfa::sim {

// A device buffer: `length` bytes at `contents`, 64-byte aligned (any element type's
// alignment), zero-filled as a new MTLBuffer is.
struct Buffer {
    uint64_t tag; // kBufferTag while alive: catches host pointers passed as buffers
    size_t length;
    void* contents;
};

inline constexpr uint64_t kBufferTag = 0x6d66612d73696d62ull; // "mfa-simb"

// A new buffer, or MFA_ERROR_OUT_OF_MEMORY with the error recorded.
mfa_status buffer_create(size_t length, Buffer** out);
// The buffer behind a caller's handle, or nullptr when the handle is not a live buffer.
Buffer* buffer_of(void* handle);
void buffer_destroy(Buffer* buffer);

// One piece of work encoded into a command buffer. The command buffer owns it from append on:
// it calls run() (at most once, at commit), then completed() exactly once, then deletes it.
class EncodedWork {
  public:
    virtual ~EncodedWork() = default;
    // Runs the work to completion; an error status with the message recorded (mfa_set_error)
    // when it fails.
    virtual mfa_status run() = 0;
    // ran: run() was called and succeeded. false when it failed, when earlier work of the
    // command buffer failed (a failed command buffer runs nothing after the fault), or when the
    // command buffer was destroyed without being committed.
    virtual void completed(bool ran) = 0;

  private:
    friend class CommandBuffer;
    EncodedWork* next_ = nullptr;
};

class CommandBuffer {
  public:
    CommandBuffer() = default;
    CommandBuffer(const CommandBuffer&) = delete;
    CommandBuffer& operator=(const CommandBuffer&) = delete;
    // Drops work that was never committed (each told completed(false)). A committed command
    // buffer has already run: commit returns after its work.
    ~CommandBuffer();

    // MFA_OK while work may still be encoded; MFA_ERROR_INVALID_ARGUMENT once committed.
    mfa_status check_encoding(const char* what);
    // Takes `work` at the end of the command buffer; fails (work not taken) once committed.
    mfa_status append(EncodedWork* work, const char* what);
    // Runs everything encoded, in order, stopping at the first failure, which becomes the
    // command buffer's status. MFA_ERROR_INVALID_ARGUMENT when already committed; otherwise
    // MFA_OK whatever the work did (its outcome is wait's).
    mfa_status commit();
    // The status of a committed command buffer's run, with its message re-recorded for the
    // calling thread; MFA_ERROR_INVALID_ARGUMENT when it was never committed.
    mfa_status wait();

  private:
    enum class State { Encoding, Completed };
    static void finish_all(EncodedWork* head, EncodedWork* failed_from);
    std::mutex mutex_;
    State state_ = State::Encoding;
    EncodedWork* head_ = nullptr;
    EncodedWork* tail_ = nullptr;
    mfa_status status_ = MFA_OK;
    char message_[512] = {};
};

} // namespace mfa::sim

#endif // MFA_METAL_SIM_COMMAND_BUFFER_H
