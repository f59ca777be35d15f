import { randomBytes } from "node:crypto";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { Listener, StagingBuffer, crc32c, send, type Grant } from "../../native/index.ts";
import { chunkHeader, hello, peer, promptly, reply, type HelloFields, type Peer } from "./raw-peer.ts";
import { rejection } from "./rejection.ts";

// A sender that breaks the chunk protocol of src/wire.hpp, written by hand: what each mistake
// is answered with, how the grant settles, and that the range can be granted and filled again.

const CHUNK = 4096; // the smallest chunk a hello may ask for
const LENGTH = 3 * CHUNK;
const OFFSET = CHUNK; // a grant away from the buffer's start, so offsets are checked against it
const CHUNK_KIND = 1;
const END_KIND = 2;

let source: StagingBuffer;
let destination: StagingBuffer;
let listener: Listener;
const streams: Peer[] = [];

beforeAll(() => {
  source = StagingBuffer.create({ size: LENGTH, lock: false });
  destination = StagingBuffer.create({ size: OFFSET + LENGTH, lock: false });
  source.bytes().set(randomBytes(LENGTH));
});
afterAll(() => {
  source.free();
  destination.free();
});
beforeEach(() => {
  listener = Listener.open();
  destination.bytes().fill(0);
});
afterEach(() => {
  for (const stream of streams.splice(0)) stream.socket.destroy();
  listener.close();
});

/** Bytes unlike the source's, so a later retry is seen to overwrite what this sender left. */
const handWritten = Buffer.alloc(LENGTH, 0xa5);

function grantRange(): Grant {
  return listener.grant(destination, { offset: OFFSET, length: LENGTH });
}

/** A stream whose hello the listener accepted. */
async function joined(grant: Grant, fields: Omit<HelloFields, "length"> = {}): Promise<Peer> {
  const stream = await peer(listener);
  streams.push(stream);
  stream.socket.write(hello(grant.ticket.token, { length: LENGTH, chunkSize: CHUNK, ...fields }));
  expect(await reply(stream)).toEqual({ code: "", message: "" });
  return stream;
}

/** Chunk `index` of the hand-written bytes, framed with its checksum. */
function chunk(index: number): Buffer {
  const payload = handWritten.subarray(index * CHUNK, (index + 1) * CHUNK);
  const trailer = Buffer.alloc(4);
  trailer.writeUInt32LE(crc32c(payload));
  return Buffer.concat([chunkHeader(CHUNK_KIND, index * CHUNK, CHUNK), payload, trailer]);
}

const end = (): Buffer => chunkHeader(END_KIND, 0, 0);

/** The range takes a whole transfer under a new grant: nothing of the failed one is left holding it. */
async function expectWritableAgain(): Promise<void> {
  const retry = grantRange();
  await send({ ticket: retry.ticket, buffer: source, chunkSize: CHUNK, streams: 2 });
  expect((await retry.completion).bytes).toBe(LENGTH);
  expect(Buffer.compare(destination.bytes(OFFSET, LENGTH), source.bytes(0, LENGTH))).toBe(0);
}

describe("a listener answering a sender that breaks the chunk protocol", () => {
  it.each<[string, Buffer[], string]>([
    ["a frame of unknown kind", [chunkHeader(3, 0, CHUNK)], "[0, 4096)"],
    ["a chunk sent twice", [chunk(0), chunkHeader(CHUNK_KIND, 0, CHUNK)], "[0, 4096)"],
    ["a chunk off the chunk boundaries", [chunkHeader(CHUNK_KIND, 100, CHUNK)], "[100, 4196)"],
    ["a chunk past the grant", [chunk(0), chunkHeader(CHUNK_KIND, LENGTH, CHUNK)], "[12288, 16384)"],
    ["a chunk shorter than its slot", [chunkHeader(CHUNK_KIND, CHUNK, CHUNK / 2)], "[4096, 6144)"],
  ])("refuses %s with protocol, fails the grant with it, and frees the range", async (_, frames, range) => {
    const grant = grantRange();
    const stream = await joined(grant);
    stream.socket.write(Buffer.concat(frames));
    const expected = { code: "protocol", message: `unexpected chunk ${range} from the sender` };
    expect(await reply(stream, 1)).toEqual(expected);
    const failure = await rejection(grant.completion);
    expect({ code: failure.code, message: failure.message }).toEqual(expected);
    stream.socket.destroy();
    await expectWritableAgain();
  });

  it("answers the stream that ends before every chunk arrived with incomplete", async () => {
    const grant = grantRange();
    const stream = await joined(grant);
    stream.socket.write(Buffer.concat([chunk(0), chunk(2), end()]));
    const expected = { code: "incomplete", message: "every stream ended but only 2 of 3 chunks arrived" };
    expect(await reply(stream, 1)).toEqual(expected);
    expect((await rejection(grant.completion)).code).toBe("incomplete");
    stream.socket.destroy();
    await expectWritableAgain();
  });

  it("settles an incomplete transfer of two streams on the last stream's end", async () => {
    const grant = grantRange();
    const first = await joined(grant, { streamIndex: 0, streamCount: 2 });
    const second = await joined(grant, { streamIndex: 1, streamCount: 2 });
    first.socket.write(Buffer.concat([chunk(0), chunk(1), end()]));
    // The first stream's own chunks verified; the transfer is not over while another stream is.
    expect(await reply(first, 1)).toEqual({ code: "", message: "" });
    second.socket.write(end());
    expect(await reply(second, 1)).toEqual({ code: "incomplete", message: "every stream ended but only 2 of 3 chunks arrived" });
    expect((await rejection(grant.completion)).code).toBe("incomplete");
    await expectWritableAgain();
  });

  it.each<[string, Omit<HelloFields, "length">]>([
    ["no streams", { streamCount: 0 }],
    ["more streams than 64", { streamCount: 65 }],
    ["a stream index past the count", { streamIndex: 2, streamCount: 2 }],
    ["a chunk size below 4096", { chunkSize: CHUNK - 1 }],
    ["a chunk size above 1 GiB", { chunkSize: 2 ** 30 + 1 }],
  ])("refuses a hello with %s, closes the connection and leaves the grant to a good sender", async (_, fields) => {
    const grant = grantRange();
    const stream = await peer(listener);
    streams.push(stream);
    stream.socket.write(hello(grant.ticket.token, { length: LENGTH, chunkSize: CHUNK, ...fields }));
    expect(await reply(stream)).toEqual({ code: "protocol", message: "invalid stream parameters in hello" });
    await promptly(stream.closed, "closing after the refusal");
    await send({ ticket: grant.ticket, buffer: source, chunkSize: CHUNK });
    expect((await grant.completion).bytes).toBe(LENGTH);
    expect(Buffer.compare(destination.bytes(OFFSET, LENGTH), source.bytes(0, LENGTH))).toBe(0);
  });

  it.each<[string, Omit<HelloFields, "length">]>([
    ["the stream index a stream already holds", { streamIndex: 0, streamCount: 2 }],
    ["another stream count", { streamIndex: 0, streamCount: 1 }],
    ["another chunk size", { streamIndex: 1, streamCount: 2, chunkSize: 2 * CHUNK }],
  ])("refuses a second sender on a token in use with %s, and the first finishes the grant", async (_, fields) => {
    const grant = grantRange();
    const first = await joined(grant, { streamIndex: 0, streamCount: 2 });
    const intruder = await peer(listener);
    streams.push(intruder);
    intruder.socket.write(hello(grant.ticket.token, { length: LENGTH, chunkSize: CHUNK, ...fields }));
    expect(await reply(intruder)).toEqual({ code: "token_used", message: "this token is already in use by another transfer" });
    await promptly(intruder.closed, "closing the refused sender");
    const second = await joined(grant, { streamIndex: 1, streamCount: 2 });
    first.socket.write(Buffer.concat([chunk(0), chunk(1), chunk(2), end()]));
    second.socket.write(end());
    expect((await grant.completion).bytes).toBe(LENGTH);
    expect(await reply(second, 1)).toEqual({ code: "", message: "" });
    expect(Buffer.compare(destination.bytes(OFFSET, LENGTH), handWritten)).toBe(0);
  });
});
