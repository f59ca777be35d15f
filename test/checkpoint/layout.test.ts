import { describe, expect, it } from "vitest";
import { crc32c } from "../../native/index.ts";
import { HEADER_BYTES, checkpointCapacity, packCheckpoint, readCheckpoint, type CheckpointItemInput } from "../../sdk/contract/checkpoint/index.ts";
import { thrown } from "./thrown.ts";

function bytesOf(length: number, seed: number): Uint8Array {
  const out = new Uint8Array(length);
  for (let i = 0; i < length; i++) out[i] = (seed + i * 37 + (i >> 8)) & 0xff;
  return out;
}

function sampleItems(): CheckpointItemInput[] {
  return [
    { fqn: "model.embed.weight", kind: "tensor", dtype: "bfloat16", chunks: [{ sizes: [33, 17], data: bytesOf(33 * 17 * 2, 1) }] },
    {
      fqn: "model.layers.0.wq",
      kind: "tensor",
      dtype: "float32",
      size: [8, 6],
      chunks: [
        { offsets: [0, 0], sizes: [4, 6], data: bytesOf(4 * 6 * 4, 2) },
        { offsets: [4, 0], sizes: [4, 6], data: bytesOf(4 * 6 * 4, 3) },
      ],
    },
    { fqn: "optim.step", kind: "bytes", data: bytesOf(5, 4) },
    { fqn: "empty", kind: "bytes", data: new Uint8Array(0) },
    { fqn: "scalar", kind: "tensor", dtype: "int64", chunks: [{ sizes: [], data: bytesOf(8, 5) }] },
  ];
}

function pack(items: CheckpointItemInput[], alignment?: number) {
  const options = alignment ? { alignment } : {};
  const target = new Uint8Array(checkpointCapacity(items, options));
  const result = packCheckpoint(target, items, options);
  return { target, ...result };
}

describe("checkpoint layout", () => {
  it("round-trips tensors (several chunks, scalars) and blobs through the reader", () => {
    const items = sampleItems();
    const { target, length } = pack(items);
    const view = readCheckpoint(target);
    expect(view.length).toBe(length);
    expect(view.metadata.items.map((item) => item.fqn)).toEqual(items.map((item) => item.fqn));
    for (const item of items) {
      if (item.kind === "bytes") {
        expect([...view.bytes(item.fqn)]).toEqual([...item.data]);
      } else {
        const chunks = view.chunks(item.fqn);
        expect(chunks.map((c) => [...c.data])).toEqual(item.chunks.map((c) => [...c.data]));
        expect(chunks.map((c) => c.sizes)).toEqual(item.chunks.map((c) => [...c.sizes]));
      }
    }
    const wq = view.metadata.items[1];
    expect(wq?.kind === "tensor" && wq.chunks.map((c) => c.offsets)).toEqual([
      [0, 0],
      [4, 0],
    ]);
  });

  it("aligns every blob, records its CRC32C, and zeroes the padding", () => {
    for (const alignment of [8, 64, 4096]) {
      const { target, metadata } = pack(sampleItems(), alignment);
      type Stored = { storageOffset: number; length: number; crc32c: number };
      const blobs = metadata.items.flatMap((item): Stored[] => (item.kind === "bytes" ? [item] : item.chunks));
      let previousEnd = HEADER_BYTES;
      for (const blob of blobs) {
        expect(blob.storageOffset % alignment).toBe(0);
        expect(blob.crc32c).toBe(crc32c(target.subarray(blob.storageOffset, blob.storageOffset + blob.length)));
        expect(target.subarray(previousEnd, blob.storageOffset).every((b) => b === 0)).toBe(true);
        previousEnd = blob.storageOffset + blob.length;
      }
    }
  });

  it("produces identical bytes for identical items", () => {
    const a = pack(sampleItems());
    const b = pack(sampleItems());
    expect(Buffer.from(a.target.subarray(0, a.length)).equals(b.target.subarray(0, b.length))).toBe(true);
  });

  it("detects a flipped bit in an item, the metadata and the header", () => {
    const { target, metadata } = pack(sampleItems());
    const chunk = metadata.items[0]?.kind === "tensor" ? metadata.items[0].chunks[0] : undefined;
    const corrupt = (at: number): Uint8Array => {
      const copy = target.slice();
      copy[at] = (copy[at] ?? 0) ^ 0x10;
      return copy;
    };
    const item = thrown(() => readCheckpoint(corrupt((chunk?.storageOffset ?? 0) + 3)));
    expect(item.code).toBe("checksum_mismatch");
    expect(item.message).toMatch(/^model\.embed\.weight chunks\[0\]: CRC32C/);
    expect(readCheckpoint(corrupt((chunk?.storageOffset ?? 0) + 3), { verify: false }).metadata.items).toHaveLength(5);
    const metadataOffset = Number(new DataView(target.buffer).getBigUint64(32, true));
    expect(thrown(() => readCheckpoint(corrupt(metadataOffset + 2))).message).toMatch(/metadata CRC32C/);
    expect(thrown(() => readCheckpoint(corrupt(20))).message).toMatch(/header CRC32C/);
  });

  it("rejects sources that are not checkpoints or are cut short", () => {
    const { target, length } = pack(sampleItems());
    expect(thrown(() => readCheckpoint(new Uint8Array(10))).code).toBe("bad_header");
    expect(thrown(() => readCheckpoint(new Uint8Array(4096))).message).toMatch(/magic/);
    expect(thrown(() => readCheckpoint(target.subarray(0, length - 1))).message).toMatch(/source holds/);
  });

  it("rejects invalid items, naming the item and the rule", () => {
    const data = new Uint8Array(16);
    const cases: [CheckpointItemInput[], RegExp, string][] = [
      [
        [
          { fqn: "a", kind: "bytes", data },
          { fqn: "a", kind: "bytes", data },
        ],
        /fqn appears twice/,
        "duplicate_fqn",
      ],
      [[{ fqn: "t", kind: "tensor", dtype: "float32", chunks: [{ sizes: [3], data }] }], /holds 16 bytes but float32\[3\] needs 12/, "invalid_item"],
      [[{ fqn: "t", kind: "tensor", dtype: "float32", size: [3], chunks: [{ offsets: [1], sizes: [4], data }] }], /extends past/, "invalid_item"],
      [[{ fqn: "t", kind: "tensor", dtype: "float32", size: [4, 1], chunks: [{ sizes: [4], data }] }], /1 dims but the tensor has 2/, "invalid_item"],
      [[{ fqn: "t", kind: "tensor", dtype: "float99" as "float32", chunks: [{ sizes: [4], data }] }], /unknown dtype/, "invalid_item"],
      [[{ fqn: "t", kind: "tensor", dtype: "uint8", chunks: [] }], /at least one chunk/, "invalid_item"],
    ];
    for (const [items, message, code] of cases) {
      const error = thrown(() => checkpointCapacity(items));
      expect(error.message).toMatch(message);
      expect(error.code).toBe(code);
    }
    expect(() => checkpointCapacity([], { alignment: 12 })).toThrow(RangeError);
    const tooSmall = thrown(() => packCheckpoint(new Uint8Array(100), sampleItems()));
    expect(tooSmall.code).toBe("too_small");
    expect(tooSmall.message).toMatch(/checkpointCapacity/);
  });

  it("parses metadata with its schema and reports unknown names", () => {
    const { target } = pack([{ fqn: "x", kind: "bytes", data: new Uint8Array(3) }]);
    const view = readCheckpoint(target);
    expect(thrown(() => view.bytes("y")).code).toBe("unknown_fqn");
    expect(thrown(() => view.chunks("x")).message).toMatch(/is a bytes item/);
  });
});
