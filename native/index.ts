// Typed loader for the native data plane: staging buffers in /dev/shm and the one-sided transfer
// engine. The whole native surface is declared in `NativeModule`; everything exported here checks
// its options (naming the option in a TypeError/RangeError) before delegating to it.
import { createRequire } from "node:module";
import { randomBytes } from "node:crypto";
import { readdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
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
    /** compiled and a device is present: listeners offer RDMA and senders use it. */
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
  /** The destination accepts the bytes as RDMA WRITEs (the handshake still uses host:port). */
  rdma: z.boolean().optional(),
});
export type TransferTicket = z.infer<typeof transferTicketSchema>;

export type Transport = "tcp" | "rdma";

export interface TransferResult {
  bytes: number;
  seconds: number;
  /** How the bytes travelled. */
  transport: Transport;
}

interface NativeStagingBuffer {
  readonly name: string;
  readonly size: number;
  readonly locked: boolean;
  readonly lockError: string | null;
  readonly freed: boolean;
  arrayBuffer(): ArrayBuffer;
  crc32c(offset: number, length: number): number;
  word(index: number, value?: number): number;
  free(): void;
}

type ListenerEvent = (token: string, code: string | null, message: string | null, bytes: number, seconds: number, transport: Transport) => void;

interface NativeListener {
  readonly port: number;
  readonly rdmaUnavailable: string | null;
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
  transport: Transport;
  rdmaDevice: string;
  rdmaPort: number;
  gidIndex: number;
}

interface NativeRdmaOptions {
  device: string;
  port: number;
  gidIndex: number;
  required: boolean;
}

type SendEvent = (kind: "progress" | "done", ...args: (string | number | null)[]) => void;

interface NativeOutgoingTransfer {
  cancel(): void;
}

interface NativeModule {
  StagingBuffer: new (name: string, size: number, create: boolean, lock: boolean) => NativeStagingBuffer;
  createStagingBufferAsync(name: string, size: number, lock: boolean): Promise<NativeStagingBuffer>;
  Listener: new (
    host: string,
    port: number,
    idleSeconds: number,
    helloSeconds: number,
    maxConnections: number,
    rdma: NativeRdmaOptions | null,
    onEvent: ListenerEvent,
  ) => NativeListener;
  OutgoingTransfer: new (buffer: NativeStagingBuffer, options: NativeSendOptions, onEvent: SendEvent) => NativeOutgoingTransfer;
  capabilities(): unknown;
  setErrorClass(errorClass: typeof TransferError): void;
  crc32c(bytes: Uint8Array, seed?: number): number;
  copyWithCrc32c(destination: Uint8Array, source: Uint8Array, seed?: number): number;
  copyWithCrc32cAsync(pairs: readonly (readonly [Uint8Array, Uint8Array])[], pin: readonly NativeStagingBuffer[]): Promise<Uint32Array>;
}

const require = createRequire(import.meta.url);
/**
 * node-gyp's output in the package (`npm install` runs it there). Found through the package's
 * own name, so it is the same from the sources (native/) and the compiled modules (dist/native/).
 */
const ADDON_DIR = join(dirname(require.resolve("monkeytree/package.json")), "native/build/Release");

function loadNative(): NativeModule {
  try {
    return require(join(ADDON_DIR, "monkeytree_native.node")) as NativeModule;
  } catch (cause) {
    throw new Error("the MonkeyTree native addon is not built; run `npm install` (it runs `node-gyp rebuild --directory native`)", { cause });
  }
}

const native = loadNative();
native.setErrorClass(TransferError);

/** The same CRC32C built as a plain shared library of two C functions, which the Python hook loads with ctypes. */
export const crc32cLibraryPath = join(ADDON_DIR, "monkeytree_crc32c.node");

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
/** Seconds from connecting within which a sender must have sent its whole hello. */
const DEFAULT_HELLO_TIMEOUT = 10;
const MAX_HELLO_TIMEOUT = 3600;
/**
 * Connections a listener keeps open at once: room for dozens of concurrent incoming transfers
 * of several streams each, far below a process's descriptor limit.
 */
const DEFAULT_MAX_CONNECTIONS = 256;
const MAX_CONNECTIONS = 65536;

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
    throw new RangeError(`${what} range [${offset}, ${offset + length}) exceeds the buffer's ${size} bytes; lower ${what}.offset or ${what}.length`);
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

/** Whether process `pid` exists (one of another user's counts). */
export function processAlive(pid: number): boolean {
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

/** A new buffer's checked size, and its name: the one given, or a generated one. */
function creation(options: CreateStagingBufferOptions): { name: string; size: number } {
  const size = checkInteger(options.size, "size", 1);
  const name = options.name ?? `monkeytree-${process.pid}-${randomBytes(6).toString("hex")}`;
  if (!SHM_NAME.test(name)) {
    throw new TypeError(`name must match ${SHM_NAME} (a file name under /dev/shm), received ${JSON.stringify(name)}`);
  }
  return { name, size };
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
    const { name, size } = creation(options);
    return new StagingBuffer(new native.StagingBuffer(name, size, true, options.lock ?? true));
  }

  /**
   * `create`, with the pages allocated on a worker thread: gigabytes take seconds that the
   * event loop keeps. Rejects with the same `TransferError`s.
   */
  static async createAsync(options: CreateStagingBufferOptions): Promise<StagingBuffer> {
    const { name, size } = creation(options);
    return new StagingBuffer(await native.createStagingBufferAsync(name, size, options.lock ?? true));
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

  /**
   * The `index`-th 64-bit word, read sequentially consistently: what another process's atomics
   * on the same file see (the Python hook's `monkeytree_barrier_enter`).
   */
  loadWord(index: number): number {
    return this.#native.word(index);
  }

  /** Writes the `index`-th 64-bit word sequentially consistently; reads after it come after it. */
  storeWord(index: number, value: number): void {
    this.#native.word(index, checkInteger(value, "value", Number.MIN_SAFE_INTEGER));
  }

  free(): void {
    this.#native.free();
  }
}

/** Which RDMA device a listener or sender uses. */
export interface RdmaDeviceOptions {
  /** ibverbs device name (default: the first). */
  device?: string;
  /** Port of the device (default 1). */
  port?: number;
  /** GID table index (default: the port's first IPv4-mapped GID, which RoCE v2 routes by; else 0). */
  gidIndex?: number;
}

function rdmaDevice(options: RdmaDeviceOptions, what: string): { device: string; port: number; gidIndex: number } {
  if (options.device !== undefined && (typeof options.device !== "string" || options.device === "")) {
    throw new TypeError(`${what}.device must be an ibverbs device name such as "mlx5_0", received ${String(options.device)}`);
  }
  return {
    device: options.device ?? "",
    port: checkInteger(options.port ?? 1, `${what}.port`, 1, 255),
    gidIndex: options.gidIndex === undefined ? -1 : checkInteger(options.gidIndex, `${what}.gidIndex`, 0, 255),
  };
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
  /**
   * Seconds from connecting within which a sender must have sent its whole hello (default 10,
   * at most 3600); a connection still short of it then is closed.
   */
  helloTimeout?: number;
  /**
   * Connections open at once, whether still saying hello or serving a grant (default 256, at
   * most 65536); each one serving a grant has its own thread. A connection beyond it closes
   * the oldest one still owing its hello, or itself when every one is serving a grant.
   */
  maxConnections?: number;
  /**
   * Whether grants accept RDMA WRITEs. By default they do when this host's RDMA device answers
   * when the listener opens, and `rdmaUnavailable` says why not otherwise; `false` keeps to TCP;
   * `true` or device options require RDMA (opening fails with `rdma_unavailable` without it).
   */
  rdma?: boolean | RdmaDeviceOptions;
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
    const helloSeconds = options.helloTimeout ?? DEFAULT_HELLO_TIMEOUT;
    if (typeof helloSeconds !== "number" || !(helloSeconds > 0 && helloSeconds <= MAX_HELLO_TIMEOUT)) {
      throw new RangeError(`helloTimeout must be a number of seconds > 0 and ≤ ${MAX_HELLO_TIMEOUT}, received ${String(helloSeconds)}`);
    }
    const maxConnections = checkInteger(options.maxConnections ?? DEFAULT_MAX_CONNECTIONS, "maxConnections", 1, MAX_CONNECTIONS);
    const rdma =
      options.rdma === false
        ? null
        : {
            ...rdmaDevice(typeof options.rdma === "object" ? options.rdma : {}, "rdma"),
            required: options.rdma !== undefined,
          };
    this.#native = new native.Listener(host, port, idleSeconds, helloSeconds, maxConnections, rdma, (token, code, message, bytes, seconds, transport) => {
      const pending = this.#pending.get(token);
      if (!pending) return;
      this.#pending.delete(token);
      if (code === null) pending.resolve({ bytes, seconds, transport });
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

  /** Why grants do not offer RDMA, or null when they do. */
  get rdmaUnavailable(): string | null {
    return this.#native.rdmaUnavailable;
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
      ticket: {
        host: this.#host,
        port: this.port,
        token,
        length: range.length,
        ...(this.rdmaUnavailable === null ? { rdma: true } : {}),
      },
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
  /**
   * `auto` (default) writes by RDMA when the ticket offers it and this host has a usable device,
   * falling back to TCP when either end turns out to have none (nothing has been written then);
   * `tcp` and `rdma` insist.
   */
  transport?: "auto" | Transport;
  /** The device RDMA uses on this host. */
  rdma?: RdmaDeviceOptions;
  /** Parallel TCP streams (default 4; RDMA uses one queue pair). */
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
   * bit flipped in its middle byte (the source buffer is untouched), so the receiver must reject
   * it. Over RDMA, where bytes in flight cannot be altered, its checksum carries the flipped bit.
   */
  corruptChunkForTesting?: number;
}

/** Writes `ticket.length` bytes of `buffer` from `offset` into the range the ticket grants. */
export function send(options: SendOptions): Promise<TransferResult> {
  const ticket = transferTicketSchema.parse(options.ticket);
  const offset = options.offset ?? 0;
  checkRange(offset, ticket.length, options.buffer.size, "send");
  const transport = options.transport ?? "auto";
  if (!["auto", "tcp", "rdma"].includes(transport)) {
    throw new TypeError(`transport must be "auto", "tcp" or "rdma", received ${String(transport)}`);
  }
  const device = rdmaDevice(options.rdma ?? {}, "rdma");
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
    transport: "tcp",
    rdmaDevice: device.device,
    rdmaPort: device.port,
    gidIndex: device.gidIndex,
  };
  if (options.signal?.aborted) {
    return Promise.reject(new TransferError("the transfer was cancelled before it started", "cancelled"));
  }
  if (transport === "rdma" && !ticket.rdma) {
    return Promise.reject(new TransferError('the destination does not offer RDMA for this ticket; send with transport "tcp"', "rdma_unavailable"));
  }
  if (transport === "tcp" || !ticket.rdma) return startTransfer(options, nativeOptions);
  const attempt = startTransfer(options, { ...nativeOptions, transport: "rdma" });
  if (transport === "rdma") return attempt;
  // A host without a usable device, on either side, answers rdma_unavailable before the grant is
  // touched (this side before it even connects): TCP can still use it.
  return attempt.catch((error: unknown) => {
    if (!(error instanceof TransferError) || error.code !== "rdma_unavailable" || options.signal?.aborted) throw error;
    return startTransfer(options, nativeOptions);
  });
}

function startTransfer(options: SendOptions, nativeOptions: NativeSendOptions): Promise<TransferResult> {
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
    if (code === null) settle?.resolve({ bytes, seconds, transport: nativeOptions.transport });
    else settle?.reject(new TransferError(message ?? code, code));
  });
  const onAbort = (): void => transfer.cancel();
  options.signal?.addEventListener("abort", onAbort, { once: true });
  return result;
}
