// packCheckpointAsync: the same bytes as packCheckpoint, with the blob copies on a worker thread
// (native copyWithCrc32cAsync), so the event loop keeps running while a large checkpoint is packed.
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { describe, expect, it } from "vitest";
import { StagingBuffer, TransferError, copyWithCrc32c, copyWithCrc32cAsync, crc32c } from "../../native/index.ts";
import {
  CheckpointError,
  checkpointCapacity,
  dtypeBytes,
  packCheckpoint,
  packCheckpointAsync,
  readCheckpoint,
  type CheckpointItemInput,
  type Dtype,
} from "../../sdk/contract/checkpoint/index.ts";

const MiB = 2 ** 20;

/** xorshift32: the same "random" item sets on every run, so a failure can be reproduced. */
function random(seed: number): () => number {
  let state = seed >>> 0 || 1;
  return () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) / 2 ** 32;
  };
}

function bytesOf(length: number, next: () => number): Uint8Array {
  const out = new Uint8Array(length);
  const words = new Uint32Array(out.buffer, 0, length >> 2);
  for (let i = 0; i < words.length; i++) words[i] = (next() * 2 ** 32) >>> 0;
  for (let i = words.length * 4; i < length; i++) out[i] = (next() * 256) & 0xff;
  return out;
}

/** A random mix: tensors of every dtype with one or several chunks, odd-sized and empty blobs. */
function randomItems(seed: number, count: number, maxBytes: number): CheckpointItemInput[] {
  const next = random(seed);
  const dtypes = Object.keys(dtypeBytes) as Dtype[];
  const items: CheckpointItemInput[] = [];
  for (let index = 0; index < count; index++) {
    const fqn = `item.${seed}.${index}`;
    if (next() < 0.35) {
      // Bytes items: odd lengths, zero-length ones, and views that start inside a larger buffer.
      const length = next() < 0.2 ? 0 : Math.floor(next() * maxBytes);
      const backing = bytesOf(length + 13, next);
      items.push({ fqn, kind: "bytes", data: backing.subarray(7, 7 + length) });
      continue;
    }
    const dtype = dtypes[Math.floor(next() * dtypes.length)] ?? "uint8";
    const element = dtypeBytes[dtype];
    const rows = 1 + Math.floor(next() * 5);
    const columns = Math.max(1, Math.floor((next() * maxBytes) / element / rows));
    // Split along dim 0 into up to `rows` chunks, some possibly empty.
    const cuts = [0, ...Array.from({ length: rows - 1 }, () => Math.floor(next() * (rows + 1))).sort((a, b) => a - b), rows];
    const chunks = [];
    for (let c = 0; c + 1 < cuts.length; c++) {
      const from = Math.min(cuts[c] ?? 0, rows);
      const to = Math.min(Math.max(cuts[c + 1] ?? rows, from), rows);
      chunks.push({ offsets: [from, 0], sizes: [to - from, columns], data: bytesOf((to - from) * columns * element, next) });
    }
    items.push({ fqn, kind: "tensor", dtype, size: [rows, columns], chunks });
  }
  return items;
}

function syncPack(items: CheckpointItemInput[], alignment?: number) {
  const options = alignment ? { alignment } : {};
  // Garbage in the target: padding must still come out zeroed.
  const target = new Uint8Array(checkpointCapacity(items, options)).fill(0xa5);
  const result = packCheckpoint(target, items, options);
  return { target, ...result };
}

async function asyncPack(items: CheckpointItemInput[], alignment?: number) {
  const options = alignment ? { alignment } : {};
  const target = new Uint8Array(checkpointCapacity(items, options)).fill(0x5a);
  const result = await packCheckpointAsync(target, items, options);
  return { target, ...result };
}

async function rejection(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (error) {
    return error as Error;
  }
  throw new Error("expected a rejection");
}

function thrown(fn: () => unknown): Error {
  try {
    fn();
  } catch (error) {
    return error as Error;
  }
  throw new Error("expected a throw");
}

function detachedView(length: number): Uint8Array {
  const buffer = new ArrayBuffer(length);
  const view = new Uint8Array(buffer);
  structuredClone(buffer, { transfer: [buffer] });
  return view;
}

describe("packCheckpointAsync", () => {
  it("writes the same bytes and metadata as packCheckpoint for random item sets", async () => {
    for (const [seed, alignment] of [
      [1, undefined],
      [2, 8],
      [3, 128],
      [4, 4096],
      [5, undefined],
      [6, 64],
    ] as const) {
      const items = randomItems(seed, 12 + seed * 3, 3000);
      const sync = syncPack(items, alignment);
      const async = await asyncPack(items, alignment);
      expect(async.length).toBe(sync.length);
      expect(async.metadata).toEqual(sync.metadata);
      // Compared up to `length`: the rest of the capacity (room for the widest checksums) is not written.
      expect(Buffer.from(async.target.subarray(0, async.length)).equals(Buffer.from(sync.target.subarray(0, sync.length)))).toBe(true);
      // And it is a valid checkpoint: every CRC verifies.
      expect(readCheckpoint(async.target.subarray(0, async.length)).metadata.items).toHaveLength(items.length);
    }
  });

  it("matches byte for byte on several MiB (large, odd-sized and empty blobs, a target with an offset)", async () => {
    const next = random(99);
    const items: CheckpointItemInput[] = [
      ...randomItems(7, 10, 64 * 1024),
      { fqn: "big.weight", kind: "tensor", dtype: "float32", chunks: [{ sizes: [1024, 1537], data: bytesOf(1024 * 1537 * 4, next) }] },
      { fqn: "big.blob", kind: "bytes", data: bytesOf(3 * MiB + 12_345, next) },
      { fqn: "big.empty", kind: "bytes", data: new Uint8Array(0) },
      { fqn: "pooled", kind: "bytes", data: Buffer.from("a Buffer from Node's shared pool") },
    ];
    const capacity = checkpointCapacity(items);
    expect(capacity).toBeGreaterThan(9 * MiB);
    const sync = syncPack(items);
    // The async target is a view 24 bytes into a larger buffer: the header must still land at its start.
    const backing = new Uint8Array(capacity + 64).fill(0x33);
    const target = backing.subarray(24, 24 + capacity);
    const result = await packCheckpointAsync(target, items);
    expect(result.length).toBe(sync.length);
    expect(result.metadata).toEqual(sync.metadata);
    expect(Buffer.from(target.subarray(0, result.length)).equals(Buffer.from(sync.target.subarray(0, sync.length)))).toBe(true);
    // Nothing outside [0, length) of the target view was touched.
    expect(backing.subarray(0, 24).every((byte) => byte === 0x33)).toBe(true);
    expect(backing.subarray(24 + result.length).every((byte) => byte === 0x33)).toBe(true);
  });

  it("keeps the event loop running while a 256 MiB checkpoint is packed", async () => {
    const chunk = 64 * MiB;
    const items: CheckpointItemInput[] = [0, 1, 2, 3].map((index) => ({
      fqn: `layer.${index}`,
      kind: "tensor",
      dtype: "uint8",
      chunks: [{ sizes: [chunk], data: new Uint8Array(chunk).fill(index * 41 + 7) }],
    }));
    items.push({ fqn: "tail", kind: "bytes", data: new Uint8Array(12_345).fill(3) });
    const target = new Uint8Array(checkpointCapacity(items));
    let ticks = 0;
    const timer = setInterval(() => ticks++, 1);
    try {
      const pending = packCheckpointAsync(target, items);
      // Nothing has been copied yet when the call returns: the copies are queued, not done.
      expect(ticks).toBe(0);
      const result = await pending;
      // Timers fired between queuing and completion: the JS thread was free during the copy.
      expect(ticks).toBeGreaterThan(0);
      const crcs = result.metadata.items.map((item) => (item.kind === "tensor" ? item.chunks[0]?.crc32c : item.crc32c));
      expect(crcs).toEqual(items.map((item) => crc32c(item.kind === "tensor" ? item.chunks[0]!.data : item.data)));
      expect(readCheckpoint(target, { verify: false }).length).toBe(result.length);
    } finally {
      clearInterval(timer);
    }
  });

  it("pins a staging buffer it writes into: free() refuses until the pack settles", async () => {
    const items: CheckpointItemInput[] = [{ fqn: "w", kind: "bytes", data: new Uint8Array(32 * MiB).fill(9) }];
    const buffer = StagingBuffer.create({ size: checkpointCapacity(items), lock: false });
    try {
      const pending = packCheckpointAsync(buffer.bytes(), items);
      const busy = thrown(() => buffer.free());
      expect(busy).toBeInstanceOf(TransferError);
      expect((busy as TransferError).code).toBe("buffer_busy");
      const result = await pending;
      expect(readCheckpoint(buffer.bytes(0, result.length)).metadata.items[0]?.fqn).toBe("w");
    } finally {
      buffer.free();
    }
    expect(buffer.freed).toBe(true);
  });

  it("rejects with the same CheckpointError as packCheckpoint when the target is too small", async () => {
    const items = randomItems(11, 6, 500);
    const small = new Uint8Array(checkpointCapacity(items) - 1);
    const expected = thrown(() => packCheckpoint(small, items));
    const pending = packCheckpointAsync(small, items);
    expect(pending).toBeInstanceOf(Promise);
    const error = await rejection(pending);
    expect(error).toBeInstanceOf(CheckpointError);
    expect((error as CheckpointError).code).toBe("too_small");
    expect(error.message).toBe(expected.message);
    expect(error.message).toMatch(/checkpointCapacity/);
    // The other planning errors come through the same way.
    const invalid = await rejection(packCheckpointAsync(new Uint8Array(4096), [{ fqn: "t", kind: "tensor", dtype: "uint8", chunks: [] }]));
    expect((invalid as CheckpointError).code).toBe("invalid_item");
    expect(await rejection(packCheckpointAsync(new Uint8Array(4096), [], { alignment: 12 }))).toBeInstanceOf(RangeError);
  });

  it("rejects a blob whose buffer was detached", async () => {
    const items: CheckpointItemInput[] = [
      { fqn: "ok", kind: "bytes", data: new Uint8Array(10) },
      { fqn: "gone", kind: "bytes", data: detachedView(16) },
    ];
    const error = await rejection(packCheckpointAsync(new Uint8Array(checkpointCapacity(items)), items));
    expect(error).toBeInstanceOf(TypeError);
    expect(error.message).toMatch(/pairs\[1\]\[1\] \(source\) is a view of a detached ArrayBuffer/);
  });
});

describe("copyWithCrc32cAsync", () => {
  it("copies every pair and resolves with each source's CRC32C, like copyWithCrc32c", async () => {
    const next = random(5);
    const sources = [bytesOf(1, next), bytesOf(0, next), bytesOf(3 * 8192 * 3 + 17, next), bytesOf(MiB + 3, next)];
    const destinations = sources.map((source) => new Uint8Array(source.byteLength));
    const crcs = await copyWithCrc32cAsync(sources.map((source, i) => [destinations[i]!, source] as const));
    expect(crcs).toBeInstanceOf(Uint32Array);
    expect([...crcs]).toEqual(sources.map((source) => copyWithCrc32c(new Uint8Array(source.byteLength), source)));
    expect(crcs[1]).toBe(0);
    sources.forEach((source, i) => expect(Buffer.from(destinations[i]!).equals(Buffer.from(source))).toBe(true));
    expect(await copyWithCrc32cAsync([])).toEqual(new Uint32Array(0));
  });

  it("keeps a source alive while copying it after JS has dropped every reference to it", async () => {
    setFlagsFromString("--expose-gc");
    const gc = runInNewContext("gc") as () => void;
    const destination = new Uint8Array(64 * MiB);
    let expected = 0;
    const pending = (() => {
      const source = new Uint8Array(64 * MiB).fill(0x42);
      expected = crc32c(source);
      return copyWithCrc32cAsync([[destination, source]]);
    })();
    // Without the addon's references this frees (munmaps) the source under the worker thread.
    gc();
    gc();
    const [crc] = await pending;
    expect(crc).toBe(expected);
    expect(crc32c(destination)).toBe(expected);
  });

  it("throws a TypeError or RangeError naming the bad pair before copying anything", () => {
    const a = new Uint8Array(8);
    const b = new Uint8Array(8).fill(1);
    const cases: [unknown, ErrorConstructor, RegExp][] = [
      [a, TypeError, /pairs must be an array of \[destination, source\] Uint8Array pairs/],
      [[[a, b], a], TypeError, /pairs\[1\] must be a \[destination, source\] array/],
      [[[a, b, a]], TypeError, /pairs\[0\] must be a \[destination, source\] array/],
      [[[new Float32Array(2), b]], TypeError, /pairs\[0\]\[0\] \(destination\) must be a Uint8Array/],
      [[[a, "bytes"]], TypeError, /pairs\[0\]\[1\] \(source\) must be a Uint8Array/],
      [
        [
          [a, b],
          [a.subarray(0, 3), b.subarray(0, 4)],
        ],
        TypeError,
        /pairs\[1\]: destination holds 3 bytes but source holds 4; they must be the same length/,
      ],
      [[[detachedView(8), b]], TypeError, /pairs\[0\]\[0\] \(destination\) is a view of a detached ArrayBuffer/],
      [[[a.subarray(0, 6), a.subarray(2, 8)]], RangeError, /pairs\[0\]: destination and source overlap/],
    ];
    for (const [pairs, type, message] of cases) {
      const error = thrown(() => copyWithCrc32cAsync(pairs as [Uint8Array, Uint8Array][]));
      expect(error).toBeInstanceOf(type);
      expect(error.message).toMatch(message);
    }
    // The valid first pair of a rejected call was not copied.
    expect(a.every((byte) => byte === 0)).toBe(true);
  });

  it("refuses a freed staging buffer's views", () => {
    const buffer = StagingBuffer.create({ size: 4096, lock: false });
    const view = buffer.bytes(0, 16);
    buffer.free();
    const error = thrown(() => copyWithCrc32cAsync([[view, new Uint8Array(0)]]));
    expect(error).toBeInstanceOf(TypeError);
    expect(error.message).toMatch(/detached/);
  });
});
