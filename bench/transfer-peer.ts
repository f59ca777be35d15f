// One side of a bench/transfer.ts run, in its own process (and network namespace):
//   receive --buffer NAME --host ADDR --length N   prints {"ticket"}, then {"received"}
//   send --buffer NAME --ticket JSON --streams N --chunk BYTES   prints {"sent"}
// Both map staging buffers the orchestrator created, so no process allocates or fills memory
// inside the timed region.
import { parseArgs } from "node:util";
import { Listener, StagingBuffer, send, transferTicketSchema } from "../native/index.ts";

const { positionals, values } = parseArgs({
  allowPositionals: true,
  options: {
    buffer: { type: "string" },
    host: { type: "string" },
    length: { type: "string" },
    ticket: { type: "string" },
    streams: { type: "string" },
    chunk: { type: "string" },
  },
});

function say(message: unknown): void {
  process.stdout.write(`${JSON.stringify(message)}\n`);
}

const buffer = StagingBuffer.open(values.buffer ?? "", { lock: false });
if (positionals[0] === "receive") {
  const listener = Listener.open({ host: values.host ?? "127.0.0.1" });
  const grant = listener.grant(buffer, { length: Number(values.length) });
  say({ ticket: grant.ticket });
  say({ received: await grant.completion });
  listener.close();
} else if (positionals[0] === "send") {
  const ticket = transferTicketSchema.parse(JSON.parse(values.ticket ?? ""));
  const started = performance.now();
  // TCP by name: the rows compare the TCP engine with a plain socket, even on a host with RDMA.
  await send({ ticket, buffer, transport: "tcp", streams: Number(values.streams), chunkSize: Number(values.chunk) });
  say({ sent: { bytes: ticket.length, seconds: (performance.now() - started) / 1000 } });
} else {
  throw new Error(`transfer-peer: unknown role ${JSON.stringify(positionals[0])}; use receive or send`);
}
buffer.free();
