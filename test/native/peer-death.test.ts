import { spawn } from "node:child_process";
import { once } from "node:events";
import { createInterface } from "node:readline";
import { describe, expect, it } from "vitest";
import { Listener, StagingBuffer, send as sendBy, transferTicketSchema, type SendOptions, type Transport, type TransferTicket } from "../../native/index.ts";
import { rejection } from "./rejection.ts";
import { transportsFor } from "./transports.ts";

const MiB = 1 << 20;
const LENGTH = 256 * MiB;
const runTs = new URL("../../bin/run-ts.js", import.meta.url).pathname;
const fixture = (name: string): string => new URL(`./fixtures/${name}`, import.meta.url).pathname;

/** A child sending `ticket` from `source` by `transport`, which signals itself once bytes are moving. */
function signalledSender(ticket: TransferTicket, source: StagingBuffer, signal: "SIGKILL" | "SIGSTOP", transport: Transport) {
  return spawn(process.execPath, [runTs, fixture("signalled-sender.ts"), JSON.stringify(ticket), source.name, signal, transport], {
    stdio: "inherit",
  });
}

/** A child listening for one transfer into `destination`, with its ticket. */
async function childReceiver(destination: StagingBuffer) {
  const child = spawn(process.execPath, [runTs, fixture("receiver.ts"), destination.name], { stdio: ["ignore", "pipe", "inherit"] });
  const [line] = (await once(createInterface({ input: child.stdout }), "line")) as [string];
  return { child, ticket: transferTicketSchema.parse(JSON.parse(line)) };
}

describe.each(transportsFor("test/native/peer-death.test.ts"))("a peer that dies or stalls mid-transfer (%s)", (transport) => {
  const send = (options: SendOptions) => sendBy({ ...options, transport });

  it("fails the grant cleanly when the sender dies, and the range can be written again", async () => {
    const source = StagingBuffer.create({ size: LENGTH, lock: false });
    const destination = StagingBuffer.create({ size: LENGTH, lock: false });
    const listener = Listener.open();
    try {
      const grant = listener.grant(destination, { length: LENGTH });
      const child = signalledSender(grant.ticket, source, "SIGKILL", transport);
      const [, signal] = (await once(child, "exit")) as [number | null, string | null];
      expect(signal).toBe("SIGKILL");
      expect((await rejection(grant.completion)).code).toBe("peer_closed");

      source.bytes(0, 4 * MiB).fill(0x5a);
      const retry = listener.grant(destination, { offset: 100, length: 4 * MiB });
      await send({ ticket: retry.ticket, buffer: source });
      await retry.completion;
      expect(destination.crc32c(100, 4 * MiB)).toBe(source.crc32c(0, 4 * MiB));
    } finally {
      listener.close();
      source.free();
      destination.free();
    }
  });

  it("rejects the send cleanly when the receiver dies, and the source stays usable", async () => {
    const source = StagingBuffer.create({ size: LENGTH, lock: false });
    const destination = StagingBuffer.create({ size: LENGTH, lock: false });
    const { child, ticket } = await childReceiver(destination);
    try {
      const sent = send({ ticket, buffer: source, chunkSize: MiB, progressEvery: MiB, onProgress: () => child.kill("SIGKILL") });
      const error = await rejection(sent);
      expect(error.code).toBe("peer_closed");
      expect(error.message).toMatch(/connection lost/);
      source.bytes(0, 8).fill(1);
      expect(source.crc32c(0, 8)).toBeTypeOf("number");
    } finally {
      child.kill("SIGKILL");
      source.free();
      destination.free();
    }
  });

  it("times out a stalled sender on the receiving side", async () => {
    const source = StagingBuffer.create({ size: LENGTH, lock: false });
    const destination = StagingBuffer.create({ size: LENGTH, lock: false });
    const listener = Listener.open({ idleTimeout: 0.5 });
    const grant = listener.grant(destination, { length: LENGTH });
    const child = signalledSender(grant.ticket, source, "SIGSTOP", transport);
    try {
      const error = await rejection(grant.completion);
      expect(error.code).toBe("timeout");
      expect(error.message).toMatch(/within the idle timeout/);
    } finally {
      child.kill("SIGKILL");
      listener.close();
      source.free();
      destination.free();
    }
  });

  it("times out a stalled receiver on the sending side", async () => {
    const source = StagingBuffer.create({ size: LENGTH, lock: false });
    const destination = StagingBuffer.create({ size: LENGTH, lock: false });
    const { child, ticket } = await childReceiver(destination);
    try {
      const sent = send({ ticket, buffer: source, streams: 1, chunkSize: MiB, progressEvery: MiB, idleTimeout: 0.5, onProgress: () => child.kill("SIGSTOP") });
      expect((await rejection(sent)).code).toBe("timeout");
    } finally {
      child.kill("SIGKILL");
      source.free();
      destination.free();
    }
  });
});
