// Typed loader for the native data plane: staging buffers in /dev/shm and the one-sided transfer
// engine. The whole native surface is declared in `NativeModule`; everything exported here checks
// its options (naming the option in a TypeError/RangeError) before delegating to it.
import { createRequire } from "node:module";
import { randomBytes } from "node:crypto";
import { readdirSync, rmSync } from "node:fs";
import { z } from "zod";

export const transferErrorCodes = [
  "bad_token",
  "token_used",
  "out_of_range",
  "checksum_mismatch",
  "incomplete",
  "peer_closed",
  "timeout",
  "cancelled",
  "revoked",
  "listener_closed",
  "connect_failed",
  "listen_failed",
  "protocol",
  "buffer_freed",
  "buffer_busy",
  "shm_failed",
  "rdma_unavailable",
  "rdma_failed",
  "io",
] as const;
export type TransferErrorCode = (typeof transferErrorCodes)[number];

/** Every failure of the native layer: a message saying what to do, and a stable `code`. */
export class TransferError extends Error {
  override readonly name = "TransferError";
  readonly code: TransferErrorCode;
  constructor(message: string, code: string) {
    super(message);
    this.code = (transferErrorCodes as readonly string[]).includes(code) ? (code as TransferErrorCode) : "io";
  }
}

export const capabilitiesSchema = z.object({
  tcp: z.object({ present: z.literal(true) }),
  rdma: z.object({
    /** This build has the RDMA WRITE transport (<infiniband/verbs.h> was found when it was built). */
    compiled: z.boolean(),
    /** compiled and a device is present: RdmaEndpoint.open() can be tried. */
    available: z.boolean(),
    present: z.boolean(),
    devices: z.array(z.string()),
    reason: z.string().nullable(),
  }),
  cuda: z.object({ present: z.boolean(), devices: z.array(z.string()), reason: z.string().nullable() }),
  gpudirect: z.object({ present: z.boolean(), devices: z.array(z.string()), reason: z.string().nullable() }),
  crc32c: z.enum(["sse4.2", "table"]),
});
export type Capabilities = z.infer<typeof capabilitiesSchema>;

/** Where and how a sender may write: handed from the destination to the source. */
export const transferTicketSchema = z.object({
  host: z.string().min(1),
  port: z.number().int().min(1).max(65535),
  token: z.string().regex(/^[0-9a-f]{32}$/),
  length: z.number().int().positive(),
});
export type TransferTicket = z.infer<typeof transferTicketSchema>;

export interface TransferResult {
  bytes: number;
  seconds: number;
}

interface NativeStagingBuffer {
  readonly name: string;
  readonly size: number;
  readonly locked: boolean;
  readonly lockError: string | null;
  readonly freed: boolean;
  arrayBuffer(): ArrayBuffer;
  crc32c(offset: number, length: number): number;
  free(): void;
}

type ListenerEvent = (token: string, code: string | null, message: string | null, bytes: number, seconds: number) => void;

interface NativeListener {
  readonly port: number;
  grant(buffer: NativeStagingBuffer, offset: number, length: number): string;
  revoke(token: string): boolean;
  close(): void;
}

interface NativeSendOptions {
  host: string;
  port: number;
  token: string;
  offset: number;
  length: number;
  streams: number;
  chunkSize: number;
  corruptChunk: number;
  progressEvery: number;
  idleSeconds: number;
}

type SendEvent = (kind: "progress" | "done", ...args: (string | number | null)[]) => void;

interface NativeOutgoingTransfer {
  cancel(): void;
}

interface NativeRdmaEndpoint {
  readonly local: unknown;
  connect(peer: RdmaPeer): void;
  write(offset: number, length: number, remoteOffset: number, imm: number): Promise<TransferResult>;
  nextWrite(): Promise<{ imm: number }>;
  close(): void;
}

interface NativeModule {
  StagingBuffer: new (name: string, size: number, create: boolean, lock: boolean) => NativeStagingBuffer;
  Listener: new (host: string, port: number, idleSeconds: number, onEvent: ListenerEvent) => NativeListener;
  OutgoingTransfer: new (buffer: NativeStagingBuffer, options: NativeSendOptions, onEvent: SendEvent) => NativeOutgoingTransfer;
  RdmaEndpoint: new (
    buffer: NativeStagingBuffer,
    offset: number,
    length: number,
    device: string,
    port: number,
    gidIndex: number,
    idleSeconds: number,
  ) => NativeRdmaEndpoint;
  capabilities(): unknown;
  setErrorClass(errorClass: typeof TransferError): void;
  crc32c(bytes: Uint8Array, seed?: number): number;
  copyWithCrc32c(destination: Uint8Array, source: Uint8Array, seed?: number): number;
  copyWithCrc32cAsync(pairs: readonly (readonly [Uint8Array, Uint8Array])[], pin: readonly NativeStagingBuffer[]): Promise<Uint32Array>;
}

function loadNative(): NativeModule {
  const require = createRequire(import.meta.url);
  try {
    return require("./build/Release/monkeytree_native.node") as NativeModule;
  } catch (cause) {
    throw new Error(
      "the MonkeyTree native addon is not built; run `npm install` (it runs `node-gyp rebuild --directory native`)",
      { cause },
    );
  }
}

const native = loadNative();
native.setErrorClass(TransferError);

const MAX_STREAMS = 64;
const MIN_CHUNK = 4096;
const MAX_CHUNK = 2 ** 30;

function checkInteger(value: unknown, option: string, min: number, max = Number.MAX_SAFE_INTEGER): number {
  if (typeof value !== "number" || !Number.isInteger(value)) {
    throw new TypeError(`${option} must be an integer, received ${String(value)}`);
  }
  if (value < min || value > max) {
    throw new RangeError(`${option} must be between ${min} and ${max}, received ${value}`);
  }
  return value;
}

/** Seconds without progress after which a transfer fails with `timeout`; 0 waits forever. */
const DEFAULT_IDLE_TIMEOUT = 30;

function checkIdleTimeout(value: unknown, option: string): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
    throw new RangeError(`${option} must be a number of seconds ≥ 0 (0 waits forever), received ${String(value)}`);
  }
  return value;
}

function checkRange(offset: number, length: number, size: number, what: string): void {
  checkInteger(offset, `${what}.offset`, 0);
  checkInteger(length, `${what}.length`, 1);
  if (offset + length > size) {
    throw new RangeError(
      `${what} range [${offset}, ${offset + length}) exceeds the buffer's ${size} bytes; lower ${what}.offset or ${what}.length`,
    );
  }
}

/** CRC32C (Castagnoli) of `bytes`, continuing from `seed` (0 to start). */
export function crc32c(bytes: Uint8Array, seed = 0): number {
  return native.crc32c(bytes, seed);
}

/** Copies `source` to the start of `destination` and returns CRC32C(source), in one pass. */
export function copyWithCrc32c(destination: Uint8Array, source: Uint8Array, seed = 0): number {
  return native.copyWithCrc32c(destination, source, seed);
}

/**
 * The staging buffer behind each ArrayBuffer that StagingBuffer.bytes() has handed out, so that
 * copyWithCrc32cAsync can pin the buffers it writes or reads: free() then refuses with
 * `buffer_busy` until the copy is done instead of unmapping memory a worker thread is using.
 */
const stagingOf = new WeakMap<ArrayBufferLike, NativeStagingBuffer>();

/**
 * Copies each `source` over its `destination` (same length, not overlapping) on a worker thread
 * and resolves with CRC32C(source) for each pair, in order, so a multi-GB copy leaves the event
 * loop free. The buffers are kept alive (and staging buffers pinned) until it settles; neither
 * side may be written, detached or transferred before then. Bad pairs throw a TypeError naming
 * the pair (a RangeError when the two overlap) before anything is copied.
 */
export function copyWithCrc32cAsync(pairs: readonly (readonly [destination: Uint8Array, source: Uint8Array])[]): Promise<Uint32Array> {
  const pin = new Set<NativeStagingBuffer>();
  for (const pair of pairs) {
    for (const view of Array.isArray(pair) ? pair : []) {
      const staging = view instanceof Uint8Array ? stagingOf.get(view.buffer) : undefined;
      if (staging) pin.add(staging);
    }
  }
  return native.copyWithCrc32cAsync(pairs, [...pin]);
}

/** What this host offers, probed now: TCP always; RDMA, CUDA, GPUDirect with a reason when absent. */
export function capabilities(): Capabilities {
  return capabilitiesSchema.parse(native.capabilities());
}

export interface CreateStagingBufferOptions {
  /** Bytes; rounded up to whole pages. */
  size: number;
  /** Name under /dev/shm; must not exist. Defaults to a fresh `monkeytree-<pid>-<random>`. */
  name?: string;
  /** Try to mlock the pages (default true); `locked` reports whether it worked. */
  lock?: boolean;
}

const SHM_NAME = /^[A-Za-z0-9._-]{1,200}$/;
/** Names StagingBuffer.create() picks by itself: the creating process id, then random hex. */
const GENERATED_NAME = /^monkeytree-(\d+)-[0-9a-f]{12}$/;

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * Removes /dev/shm files left by processes that died without free() (a killed daemon or
 * worker cannot clean up after itself). Only names StagingBuffer.create() generated are
 * considered, and only when their creating process no longer exists; returns the names removed.
 */
export function removeStaleStagingBuffers(directory = "/dev/shm"): string[] {
  const removed: string[] = [];
  for (const name of readdirSync(directory)) {
    const pid = Number(GENERATED_NAME.exec(name)?.[1]);
    if (!pid || processAlive(pid)) continue;
    rmSync(`${directory}/${name}`, { force: true });
    removed.push(name);
  }
  return removed.sort();
}

/** The native object behind a StagingBuffer, for the transfer classes in this module only. */
let handleOf: (buffer: StagingBuffer) => NativeStagingBuffer;

/**
 * Page-aligned host memory backed by /dev/shm/<name>, so a process on the same host can mmap
 * the same bytes. `free()` unmaps it (and removes the file if this process created it); views
 * obtained from `bytes()` are detached then, and every later use throws `buffer_freed`.
 */
export class StagingBuffer {
  readonly #native: NativeStagingBuffer;

  private constructor(handle: NativeStagingBuffer) {
    this.#native = handle;
  }

  static {
    handleOf = (buffer) => buffer.#native;
  }

  static create(options: CreateStagingBufferOptions): StagingBuffer {
    const size = checkInteger(options.size, "size", 1);
    const name = options.name ?? `monkeytree-${process.pid}-${randomBytes(6).toString("hex")}`;
    if (!SHM_NAME.test(name)) {
      throw new TypeError(`name must match ${SHM_NAME} (a file name under /dev/shm), received ${JSON.stringify(name)}`);
    }
    return new StagingBuffer(new native.StagingBuffer(name, size, true, options.lock ?? true));
  }

  /** Maps an existing /dev/shm/<name> (created by another process); free() leaves the file. */
  static open(name: string, options: { lock?: boolean } = {}): StagingBuffer {
    if (!SHM_NAME.test(name)) {
      throw new TypeError(`name must match ${SHM_NAME} (a file name under /dev/shm), received ${JSON.stringify(name)}`);
    }
    return new StagingBuffer(new native.StagingBuffer(name, 0, false, options.lock ?? true));
  }

  get name(): string {
    return this.#native.name;
  }
  /** The path another process opens to map these bytes. */
  get path(): string {
    return `/dev/shm/${this.#native.name}`;
  }
  get size(): number {
    return this.#native.size;
  }
  get locked(): boolean {
    return this.#native.locked;
  }
  /** Why the pages are not locked, or null when they are. */
  get lockError(): string | null {
    return this.#native.lockError;
  }
  get freed(): boolean {
    return this.#native.freed;
  }

  /** A view of [offset, offset + length) of the buffer's memory, without copying. */
  bytes(offset = 0, length = this.size - offset): Uint8Array {
    checkRange(offset, length, this.size, "bytes");
    const arrayBuffer = this.#native.arrayBuffer();
    stagingOf.set(arrayBuffer, this.#native);
    return new Uint8Array(arrayBuffer, offset, length);
  }

  crc32c(offset = 0, length = this.size - offset): number {
    checkRange(offset, length, this.size, "crc32c");
    return this.#native.crc32c(offset, length);
  }

  free(): void {
    this.#native.free();
  }
}

export interface ListenOptions {
  /** Address to bind (default 127.0.0.1). */
  host?: string;
  /** Port to bind; 0 picks a free one (default). */
  port?: number;
  /** Host name senders should use, when it differs from the bound address (e.g. 0.0.0.0). */
  advertise?: string;
  /** Seconds a transfer may go without receiving anything before it fails with `timeout` (default 30; 0 = never). */
  idleTimeout?: number;
}

export interface Grant {
  readonly ticket: TransferTicket;
  readonly offset: number;
  /** Settles once the range holds every verified byte, or with a TransferError. */
  readonly completion: Promise<TransferResult>;
}

interface Pending {
  resolve(result: TransferResult): void;
  reject(error: TransferError): void;
}

/**
 * The destination side: exposes staging buffers to remote writers. Each grant authorises one
 * transfer into one range; its token is single-use. Keeps the process alive until close().
 */
export class Listener {
  readonly #native: NativeListener;
  readonly #host: string;
  readonly #pending = new Map<string, Pending>();

  private constructor(options: ListenOptions) {
    const host = options.host ?? "127.0.0.1";
    const port = checkInteger(options.port ?? 0, "port", 0, 65535);
    const idleSeconds = checkIdleTimeout(options.idleTimeout ?? DEFAULT_IDLE_TIMEOUT, "idleTimeout");
    this.#native = new native.Listener(host, port, idleSeconds, (token, code, message, bytes, seconds) => {
      const pending = this.#pending.get(token);
      if (!pending) return;
      this.#pending.delete(token);
      if (code === null) pending.resolve({ bytes, seconds });
      else pending.reject(new TransferError(message ?? code, code));
    });
    this.#host = options.advertise ?? host;
  }

  static open(options: ListenOptions = {}): Listener {
    return new Listener(options);
  }

  get port(): number {
    return this.#native.port;
  }

  /** Authorises one write of exactly `length` bytes into [offset, offset + length) of `buffer`. */
  grant(buffer: StagingBuffer, range: { offset?: number; length: number }): Grant {
    const offset = range.offset ?? 0;
    checkRange(offset, range.length, buffer.size, "grant");
    const token = this.#native.grant(handleOf(buffer), offset, range.length);
    const completion = new Promise<TransferResult>((resolve, reject) => {
      this.#pending.set(token, { resolve, reject });
    });
    // The caller may never await a grant it revokes; that must not be an unhandled rejection.
    completion.catch(() => undefined);
    return {
      ticket: { host: this.#host, port: this.port, token, length: range.length },
      offset,
      completion,
    };
  }

  /** Withdraws a grant (stopping its transfer if running); false when it had already settled. */
  revoke(token: string): boolean {
    return this.#native.revoke(token);
  }

  /** Stops listening; outstanding grants fail with `listener_closed`. */
  close(): void {
    this.#native.close();
  }
}

export interface SendOptions {
  ticket: TransferTicket;
  buffer: StagingBuffer;
  /** Where the bytes start in `buffer` (default 0); `ticket.length` bytes are sent. */
  offset?: number;
  /** Parallel TCP streams (default 4). */
  streams?: number;
  /** Bytes per chunk, each with its own CRC32C (default 8 MiB). */
  chunkSize?: number;
  signal?: AbortSignal;
  /** Called with the bytes handed to the network so far (not yet verified by the receiver). */
  onProgress?: (bytesSent: number) => void;
  /** Bytes between progress calls (default 64 MiB). */
  progressEvery?: number;
  /** Seconds a stream may go without sending or receiving anything before the send fails with `timeout` (default 30; 0 = never). */
  idleTimeout?: number;
  /**
   * Test-only fault injection: the chunk with this index is checksummed, then sent with one
   * bit flipped in its middle byte (the source buffer is untouched), so the receiver must reject it.
   */
  corruptChunkForTesting?: number;
}

/** Writes `ticket.length` bytes of `buffer` from `offset` into the range the ticket grants. */
export function send(options: SendOptions): Promise<TransferResult> {
  const ticket = transferTicketSchema.parse(options.ticket);
  const offset = options.offset ?? 0;
  checkRange(offset, ticket.length, options.buffer.size, "send");
  const nativeOptions: NativeSendOptions = {
    host: ticket.host,
    port: ticket.port,
    token: ticket.token,
    offset,
    length: ticket.length,
    streams: checkInteger(options.streams ?? 4, "streams", 1, MAX_STREAMS),
    chunkSize: checkInteger(options.chunkSize ?? 8 * 2 ** 20, "chunkSize", MIN_CHUNK, MAX_CHUNK),
    corruptChunk: checkInteger(options.corruptChunkForTesting ?? -1, "corruptChunkForTesting", -1),
    progressEvery: options.onProgress ? checkInteger(options.progressEvery ?? 64 * 2 ** 20, "progressEvery", 1) : 0,
    idleSeconds: checkIdleTimeout(options.idleTimeout ?? DEFAULT_IDLE_TIMEOUT, "idleTimeout"),
  };
  if (options.signal?.aborted) {
    return Promise.reject(new TransferError("the transfer was cancelled before it started", "cancelled"));
  }
  let settle: { resolve(result: TransferResult): void; reject(error: TransferError): void } | undefined;
  const result = new Promise<TransferResult>((resolve, reject) => {
    settle = { resolve, reject };
  });
  // Constructed outside the promise so bad arguments (a freed buffer) throw, like the checks above.
  const transfer = new native.OutgoingTransfer(handleOf(options.buffer), nativeOptions, (kind, ...args) => {
    if (kind === "progress") {
      options.onProgress?.(args[0] as number);
      return;
    }
    options.signal?.removeEventListener("abort", onAbort);
    const [code, message, bytes, seconds] = args as [string | null, string | null, number, number];
    if (code === null) settle?.resolve({ bytes, seconds });
    else settle?.reject(new TransferError(message ?? code, code));
  });
  const onAbort = (): void => transfer.cancel();
  options.signal?.addEventListener("abort", onAbort, { once: true });
  return result;
}

/** What an RDMA endpoint hands its peer (through any channel) so that the peer can connect(). */
export const rdmaPeerSchema = z.object({
  device: z.string(),
  port: z.number().int().min(1).max(255),
  qpn: z.number().int().min(0).max(0xffffff),
  psn: z.number().int().min(0).max(0xffffff),
  lid: z.number().int().min(0).max(0xffff),
  gid: z.string().regex(/^[0-9a-f]{32}$/),
  /** ibv_mtu: 1 = 256 … 5 = 4096 bytes. */
  mtu: z.number().int().min(1).max(5),
  /** Virtual address of the registered range, 16 hex digits. */
  address: z.string().regex(/^[0-9a-f]{16}$/),
  rkey: z.number().int().min(0).max(0xffffffff),
  length: z.number().int().positive(),
});
export type RdmaPeer = z.infer<typeof rdmaPeerSchema>;

export interface OpenRdmaOptions {
  buffer: StagingBuffer;
  /** The range of `buffer` to register (default: all of it); the peer may write anywhere in it. */
  offset?: number;
  length?: number;
  /** ibverbs device name (default: the first). */
  device?: string;
  /** Port of the device (default 1). */
  port?: number;
  /** GID table index (default 0; RoCE v2 usually needs the index of the IPv4-mapped GID). */
  gidIndex?: number;
  /** Seconds write()/nextWrite() wait for their completion before failing with `timeout` (default 30; 0 = never). */
  idleTimeout?: number;
}

/**
 * One-sided RDMA WRITE over an ibverbs RC queue pair, over one registered range of a staging
 * buffer. Both sides open() an endpoint, exchange `local` through any channel, and connect() to
 * each other; the source's write() then puts bytes straight into the destination's range, and the
 * destination's nextWrite() resolves once a write has fully landed. Holding an endpoint pins
 * its buffer (free() refuses with `buffer_busy`) until close(). Transfers choose TCP (`send`)
 * unless `capabilities().rdma.available`.
 */
export class RdmaEndpoint {
  readonly #native: NativeRdmaEndpoint;
  readonly #length: number;

  private constructor(handle: NativeRdmaEndpoint, length: number) {
    this.#native = handle;
    this.#length = length;
  }

  /** Throws TransferError `rdma_unavailable` when this build has no RDMA or the host no usable device. */
  static open(options: OpenRdmaOptions): RdmaEndpoint {
    const offset = options.offset ?? 0;
    const length = options.length ?? options.buffer.size - offset;
    checkRange(offset, length, options.buffer.size, "rdma");
    const port = checkInteger(options.port ?? 1, "port", 1, 255);
    const gidIndex = checkInteger(options.gidIndex ?? 0, "gidIndex", 0, 255);
    const idleSeconds = checkIdleTimeout(options.idleTimeout ?? DEFAULT_IDLE_TIMEOUT, "idleTimeout");
    const handle = new native.RdmaEndpoint(
      handleOf(options.buffer),
      offset,
      length,
      options.device ?? "",
      port,
      gidIndex,
      idleSeconds,
    );
    return new RdmaEndpoint(handle, length);
  }

  get local(): RdmaPeer {
    return rdmaPeerSchema.parse(this.#native.local);
  }

  /** Brings the queue pair to ready-to-send against the peer's `local`. */
  connect(peer: RdmaPeer): void {
    this.#native.connect(rdmaPeerSchema.parse(peer));
  }

  /**
   * Writes [offset, offset + length) of this endpoint's range into the peer's range at
   * `remoteOffset`; resolves once the peer's adapter has acknowledged every byte. `imm` (32 bits)
   * reaches the peer's nextWrite().
   */
  write(options: { offset?: number; length: number; remoteOffset?: number; imm?: number }): Promise<TransferResult> {
    const offset = options.offset ?? 0;
    checkRange(offset, options.length, this.#length, "write");
    const remoteOffset = checkInteger(options.remoteOffset ?? 0, "write.remoteOffset", 0);
    const imm = checkInteger(options.imm ?? 0, "write.imm", 0, 0xffffffff);
    return this.#native.write(offset, options.length, remoteOffset, imm);
  }

  /** Resolves with the immediate of the next write the peer completed into this endpoint's range. */
  nextWrite(): Promise<{ imm: number }> {
    return this.#native.nextWrite();
  }

  /** Destroys the queue pair and deregisters the range; pending operations reject with `cancelled`. */
  close(): void {
    this.#native.close();
  }
}
