import { connect, type Socket } from "node:net";
import { once } from "node:events";
import type { Listener } from "../../native/index.ts";

// A transfer sender written by hand against src/wire.hpp, for tests that must say what the
// native sender never would: a stranger, a slow hello, a broken chunk stream.

const MiB = 1 << 20;
/** Far above the milliseconds a listener takes to answer or close; only a hang reaches it. */
export const SAFETY_MS = 5_000;

export interface HelloFields {
  length: number;
  streamIndex?: number;
  streamCount?: number;
  chunkSize?: number;
  rdma?: boolean;
}

/** A hello as src/wire.hpp lays it out. */
export function hello(token: string, fields: HelloFields): Buffer {
  const bytes = Buffer.alloc(48);
  bytes.writeUInt32LE(0x3158544d, 0);
  bytes.writeUInt16LE(1, 4);
  bytes.writeUInt16LE(fields.streamIndex ?? 0, 6);
  bytes.writeUInt16LE(fields.streamCount ?? 1, 8);
  bytes.writeUInt16LE(fields.rdma ? 1 : 0, 10);
  bytes.writeUInt32LE(fields.chunkSize ?? MiB, 12);
  bytes.writeBigUInt64LE(BigInt(fields.length), 16);
  Buffer.from(token, "hex").copy(bytes, 24);
  return bytes;
}

/** A chunk frame header: kind 1 is a chunk, 2 ends the stream. */
export function chunkHeader(kind: number, offset: number, length: number): Buffer {
  const bytes = Buffer.alloc(16);
  bytes.writeUInt32LE(kind, 0);
  bytes.writeUInt32LE(length, 4);
  bytes.writeBigUInt64LE(BigInt(offset), 8);
  return bytes;
}

export interface Peer {
  readonly socket: Socket;
  /** Everything the listener sent, so far. */
  readonly received: () => Buffer;
  /** Settles when the listener has closed the connection (or reset it). */
  readonly closed: Promise<void>;
}

/** A raw connection to `listener`, connected: a stranger, or a sender written by hand. */
export async function peer(listener: Pick<Listener, "port">): Promise<Peer> {
  const socket = connect(listener.port, "127.0.0.1");
  const chunks: Buffer[] = [];
  socket.on("data", (chunk: Buffer) => chunks.push(chunk));
  // A listener closing with bytes unread resets the connection; that is a close here too.
  socket.on("error", () => undefined);
  // Not events.once: it rejects on "error", and a reset stranger nobody awaits would be an
  // unhandled rejection.
  const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()));
  await once(socket, "connect");
  return { socket, received: () => Buffer.concat(chunks), closed };
}

/** Rejects when `promise` takes longer than SAFETY_MS. */
export function promptly<T>(promise: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} took over ${SAFETY_MS} ms`)), SAFETY_MS);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

export interface Reply {
  /** "" for an acceptance or a verified stream. */
  code: string;
  message: string;
}

/** The replies wholly received so far, in order. */
function repliesIn(bytes: Buffer): Reply[] {
  const replies: Reply[] = [];
  for (let at = 0; at + 8 <= bytes.length;) {
    const codeLength = bytes.readUInt32LE(at);
    const end = at + 8 + codeLength + bytes.readUInt32LE(at + 4);
    if (end > bytes.length) break;
    replies.push({ code: bytes.subarray(at + 8, at + 8 + codeLength).toString(), message: bytes.subarray(at + 8 + codeLength, end).toString() });
    at = end;
  }
  return replies;
}

/** The listener's `index`-th reply on this connection, once it has arrived whole. */
export async function reply(connection: Peer, index = 0): Promise<Reply> {
  for (;;) {
    const replies = repliesIn(connection.received());
    if (replies[index]) return replies[index];
    if (connection.socket.closed) throw new Error(`the listener closed the connection after ${replies.length} replies`);
    await Promise.race([once(connection.socket, "data"), connection.closed]);
  }
}

/** The code of the listener's first reply, "" for an acceptance. */
export async function replyCode(connection: Peer): Promise<string> {
  return (await reply(connection)).code;
}
