import { connect } from "node:net";
import { once } from "node:events";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Listener, StagingBuffer, TransferError, send as sendBy, type SendOptions, type TransferTicket } from "../../native/index.ts";
import { rejection } from "./rejection.ts";
import { transportsFor } from "./transports.ts";

const MiB = 1 << 20;
let listener: Listener;
let source: StagingBuffer;
let destination: StagingBuffer;

beforeAll(() => {
  listener = Listener.open();
  source = StagingBuffer.create({ size: 8 * MiB, lock: false });
  destination = StagingBuffer.create({ size: 8 * MiB, lock: false });
  const bytes = source.bytes();
  let state = 0x9e3779b9;
  for (let i = 0; i < bytes.length; i += 4) {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    new DataView(bytes.buffer, bytes.byteOffset + i, 4).setUint32(0, state, true);
  }
});
afterAll(() => {
  listener.close();
  source.free();
  destination.free();
});

function expectSameBytes(from: number, to: number, length: number): void {
  expect(destination.crc32c(to, length)).toBe(source.crc32c(from, length));
  expect(Buffer.from(destination.bytes(to, length)).equals(source.bytes(from, length))).toBe(true);
}

describe.each(transportsFor("test/native/transfer.test.ts"))("%s transfer", (transport) => {
  // Every send of this suite goes by `transport`: RDMA where the host has a device, TCP always.
  const send = (options: SendOptions) => sendBy({ ...options, transport });

  it("round-trips random sizes and offsets exactly, touching nothing outside the range", async () => {
    let seed = 12345;
    const random = (n: number): number => {
      seed = ((Math.imul(seed, 48271) + 1) >>> 0) % 0x7fffffff;
      return seed % n;
    };
    for (let round = 0; round < 12; round++) {
      const length = 1 + random(3 * MiB);
      const from = random(source.size - length);
      const to = 1 + random(destination.size - length - 2);
      const chunkSize = 4096 * (1 + random(256));
      const streams = 1 + random(6);
      destination.bytes().fill(0xee, to - 1, to + length + 1);
      const grant = listener.grant(destination, { offset: to, length });
      const [sent, received] = await Promise.all([send({ ticket: grant.ticket, buffer: source, offset: from, streams, chunkSize }), grant.completion]);
      expect(sent).toMatchObject({ bytes: length, transport });
      expect(received).toMatchObject({ bytes: length, transport });
      expectSameBytes(from, to, length);
      expect(destination.bytes(to - 1, 1)[0]).toBe(0xee);
      expect(destination.bytes(to + length, 1)[0]).toBe(0xee);
    }
  });

  it("reports progress in increasing steps up to the length", async () => {
    const grant = listener.grant(destination, { length: 4 * MiB });
    const seen: number[] = [];
    await send({ ticket: grant.ticket, buffer: source, chunkSize: 256 * 1024, progressEvery: MiB, onProgress: (n) => seen.push(n) });
    await grant.completion;
    expect(seen.length).toBeGreaterThanOrEqual(3);
    expect(seen).toEqual([...seen].sort((a, b) => a - b));
    expect(seen.at(-1)).toBeLessThanOrEqual(4 * MiB);
  });

  it("runs concurrent transfers into disjoint ranges of one buffer", async () => {
    const part = 2 * MiB - 4096;
    const grants = [0, 1, 2, 3].map((i) => listener.grant(destination, { offset: i * 2 * MiB, length: part }));
    await Promise.all(grants.map((grant, i) => send({ ticket: grant.ticket, buffer: source, offset: (3 - i) * 2 * MiB, streams: 2, chunkSize: 64 * 1024 })));
    await Promise.all(grants.map((grant) => grant.completion));
    for (let i = 0; i < 4; i++) expectSameBytes((3 - i) * 2 * MiB, i * 2 * MiB, part);
  });

  it("detects a corrupted chunk on arrival and leaves the buffer usable", async () => {
    const grant = listener.grant(destination, { length: 2 * MiB });
    const sent = send({ ticket: grant.ticket, buffer: source, chunkSize: 256 * 1024, streams: 3, corruptChunkForTesting: 5 });
    const [senderError, receiverError] = await Promise.all([rejection(sent), rejection(grant.completion)]);
    expect(senderError.code).toBe("checksum_mismatch");
    expect(receiverError.code).toBe("checksum_mismatch");
    expect(receiverError.message).toMatch(/chunk \[1310720, 1572864\) .* arrived corrupted/);
    const retry = listener.grant(destination, { length: 2 * MiB });
    await send({ ticket: retry.ticket, buffer: source, chunkSize: 256 * 1024 });
    await retry.completion;
    expectSameBytes(0, 0, 2 * MiB);
  });

  it("detects a bit flipped in the middle of a chunk, after pieces that checked out, and in a short last chunk", async () => {
    // Both sides checksum a chunk piece by piece; a flip in a later piece of a full chunk, or in a
    // last chunk that its pieces do not divide evenly, must still fail that chunk.
    const length = 5 * MiB + 12345;
    const chunkSize = 2 * MiB;
    for (const [chunk, range] of [
      [1, "[2097152, 4194304)"],
      [2, `[4194304, ${length})`],
    ] as const) {
      const grant = listener.grant(destination, { length });
      const sent = send({ ticket: grant.ticket, buffer: source, chunkSize, streams: 2, corruptChunkForTesting: chunk });
      const [senderError, receiverError] = await Promise.all([rejection(sent), rejection(grant.completion)]);
      expect(senderError.code).toBe("checksum_mismatch");
      expect(receiverError.code).toBe("checksum_mismatch");
      expect(receiverError.message).toContain(`chunk ${range} `);
    }
    const retry = listener.grant(destination, { length });
    await send({ ticket: retry.ticket, buffer: source, chunkSize, streams: 2 });
    await retry.completion;
    expectSameBytes(0, 0, length);
  });

  it("rejects a wrong token, a reused token and a length the grant does not cover", async () => {
    const grant = listener.grant(destination, { length: MiB });
    const wrong: TransferTicket = { ...grant.ticket, token: "0123456789abcdef0123456789abcdef" };
    expect((await rejection(send({ ticket: wrong, buffer: source }))).code).toBe("bad_token");

    const longer: TransferTicket = { ...grant.ticket, length: MiB + 1 };
    const mismatch = await rejection(send({ ticket: longer, buffer: source }));
    expect(mismatch.code).toBe("out_of_range");
    expect(mismatch.message).toMatch(/wants to write 1048577 bytes but the grant covers 1048576/);

    await send({ ticket: grant.ticket, buffer: source });
    await grant.completion;
    const reused = await rejection(send({ ticket: grant.ticket, buffer: source }));
    expect(reused.code).toBe("token_used");
    expect(reused.message).toMatch(/ask the destination for a new grant/);
  });

  it("checks ranges and options before anything starts, naming the option", () => {
    expect(() => listener.grant(destination, { offset: destination.size - 10, length: 11 })).toThrow(/grant range .* exceeds/);
    expect(() => listener.grant(destination, { length: 0 })).toThrow(/grant.length/);
    const grant = listener.grant(destination, { length: MiB });
    expect(() => send({ ticket: grant.ticket, buffer: source, offset: source.size - 100 })).toThrow(RangeError);
    expect(() => send({ ticket: grant.ticket, buffer: source, streams: 65 })).toThrow(/streams must be between 1 and 64/);
    expect(() => send({ ticket: grant.ticket, buffer: source, chunkSize: 100 })).toThrow(/chunkSize/);
    expect(() => send({ ticket: { ...grant.ticket, token: "xyz" }, buffer: source })).toThrow(/token/);
    expect(listener.revoke(grant.ticket.token)).toBe(true);
  });

  it("revokes a grant: its completion rejects and its token is spent", async () => {
    const grant = listener.grant(destination, { length: MiB });
    expect(listener.revoke(grant.ticket.token)).toBe(true);
    expect(listener.revoke(grant.ticket.token)).toBe(false);
    expect((await rejection(grant.completion)).code).toBe("revoked");
    expect((await rejection(send({ ticket: grant.ticket, buffer: source }))).code).toBe("token_used");
  });

  it("refuses to free a buffer while a grant holds it, and a freed buffer cannot send", async () => {
    const scratch = StagingBuffer.create({ size: MiB, lock: false });
    const grant = listener.grant(scratch, { length: MiB });
    let busy: unknown;
    try {
      scratch.free();
    } catch (error) {
      busy = error;
    }
    expect((busy as TransferError).code).toBe("buffer_busy");
    listener.revoke(grant.ticket.token);
    await rejection(grant.completion);
    scratch.free();
    const other = listener.grant(destination, { length: MiB });
    expect(() => send({ ticket: other.ticket, buffer: scratch })).toThrow(/was freed/);
    listener.revoke(other.ticket.token);
  });

  it("cancels through an AbortSignal; the receiver sees the sender go", async () => {
    const big = StagingBuffer.create({ size: 128 * MiB, lock: false });
    const sink = StagingBuffer.create({ size: 128 * MiB, lock: false });
    try {
      const grant = listener.grant(sink, { length: big.size });
      const controller = new AbortController();
      const sent = send({
        ticket: grant.ticket,
        buffer: big,
        chunkSize: MiB,
        progressEvery: MiB,
        signal: controller.signal,
        onProgress: () => controller.abort(),
      });
      expect((await rejection(sent)).code).toBe("cancelled");
      expect((await rejection(grant.completion)).code).toBe("peer_closed");
      const aborted = send({ ticket: grant.ticket, buffer: big, signal: controller.signal });
      expect((await rejection(aborted)).code).toBe("cancelled");
    } finally {
      big.free();
      sink.free();
    }
  });

  it("answers a client that does not speak the protocol with an error, leaving grants intact", async () => {
    const grant = listener.grant(destination, { length: MiB });
    const socket = connect(listener.port, "127.0.0.1");
    await once(socket, "connect");
    socket.write(Buffer.alloc(48, 0x41));
    const chunks: Buffer[] = [];
    socket.on("data", (chunk: Buffer) => chunks.push(chunk));
    socket.end();
    await once(socket, "close");
    const reply = Buffer.concat(chunks);
    const codeLength = reply.readUInt32LE(0);
    expect(reply.subarray(8, 8 + codeLength).toString()).toBe("protocol");
    expect(reply.subarray(8 + codeLength).toString()).toMatch(/not a MonkeyTree transfer sender/);
    await send({ ticket: grant.ticket, buffer: source });
    await grant.completion;
  });

  it("fails outstanding grants when the listener closes, and cannot connect afterwards", async () => {
    const own = Listener.open();
    const grant = own.grant(destination, { length: MiB });
    own.close();
    expect((await rejection(grant.completion)).code).toBe("listener_closed");
    expect((await rejection(send({ ticket: grant.ticket, buffer: source }))).code).toBe("connect_failed");
  });
});
