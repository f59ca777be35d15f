// The floor under the controller's barrier round trip (bench/control.ts): a bare ZeroMQ
// ROUTER, configured as the controller's, that sends every message straight back to its
// sender through the same one-send-at-a-time chain. Prints `listening on ENDPOINT`.
import { Router } from "zeromq";
import { MAX_REQUEST_BYTES } from "../sdk/protocol/limits.ts";

const socket = new Router({ linger: 0, sendHighWaterMark: 100_000, receiveHighWaterMark: 100_000, maxMessageSize: MAX_REQUEST_BYTES });
await socket.bind("tcp://127.0.0.1:*");
process.stdout.write(`listening on ${socket.lastEndpoint}\n`);
// Closing the socket ends the loop below, and the process with it.
process.once("SIGTERM", () => socket.close());
let sending: Promise<void> = Promise.resolve();
try {
  for await (const [peer, frame] of socket) {
    if (!peer || !frame) continue;
    sending = sending.then(() => socket.send([peer, frame]));
  }
} catch {
  // The iterator throws when the socket closes under it: the benchmark is done.
}
