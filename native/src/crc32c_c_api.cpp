// C entry points for processes that are not Node: the Python hook loads this library with
// ctypes to checksum checkpoints at memory speed instead of ~150 MB/s, and to pass a barrier
// without a message to its launcher (the words of the launcher's control block).
#include <cstdint>

#include "crc32c.hpp"

extern "C" {

__attribute__((visibility("default"))) uint32_t monkeytree_crc32c(const void* data, size_t length, uint32_t crc) {
  return mt::Crc32c(crc, data, length);
}

__attribute__((visibility("default"))) uint32_t monkeytree_copy_crc32c(void* dst, const void* src, size_t length,
                                                                       uint32_t crc) {
  return mt::CopyWithCrc32c(crc, dst, src, length);
}

// A process at barrier `step` says so in its slot, then reads the launcher's stop word, both
// sequentially consistent: the launcher writes the stop word, then reads the slots, so one of the
// two sees the other's write (sdk/client/hold.ts). It may pass the barrier when `step` is below the
// returned word; otherwise it asks the launcher over the channel.
__attribute__((visibility("default"))) int64_t monkeytree_barrier_enter(int64_t* slot, const int64_t* stop,
                                                                        int64_t step) {
  __atomic_store_n(slot, step, __ATOMIC_SEQ_CST);
  return __atomic_load_n(stop, __ATOMIC_SEQ_CST);
}

// It did not pass barrier `step` after all: its slot says the one before, which it did pass.
__attribute__((visibility("default"))) void monkeytree_barrier_ask(int64_t* slot, int64_t step) {
  __atomic_store_n(slot, step - 1, __ATOMIC_SEQ_CST);
}
}
