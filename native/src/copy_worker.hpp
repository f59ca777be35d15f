#pragma once
// copyWithCrc32cAsync: the bulk copies of packing a checkpoint, run on a libuv worker thread so
// that a multi-GB pack does not stall the JS thread (heartbeats, sockets) for its duration.
#include <napi.h>

namespace mt {

// copyWithCrc32cAsync(pairs: [destination: Uint8Array, source: Uint8Array][],
//                     pin: StagingBuffer[]) → Promise<Uint32Array>
// Copies each source over its destination (same length, not overlapping), in order, and resolves
// with CRC32C(source) for each pair. Bad arguments throw (TypeError/RangeError, or TransferError
// buffer_freed for a freed buffer in `pin`) before anything is queued.
Napi::Value CopyWithCrc32cAsync(const Napi::CallbackInfo& info);

}  // namespace mt
