import { describe, expect, it } from "vitest";
import { crc32c } from "../../native/index.ts";
import { checkpointCapacity, packCheckpoint, readCheckpoint, type CheckpointErrorCode } from "../../sdk/contract/checkpoint/index.ts";
import { thrown } from "./thrown.ts";

// Checkpoints whose every checksum is right but whose structure breaks a rule of FORMAT.md: the
// header and metadata CRCs are recomputed after each change, so only the reader's structural
// check stands between the broken checkpoint and a caller reading through it.

const encoder = new TextEncoder();

/** Header fields as FORMAT.md lays them out. */
const at = { version: 8, alignment: 12, dataOffset: 16, dataLength: 24, metadataOffset: 32, metadataLength: 40, totalLength: 48 };

/** A tensor of two chunks and a blob, packed with alignment 64: data at 64, items at 64, 128, 192. */
function packed(): Uint8Array {
  const items = [
    {
      fqn: "w",
      kind: "tensor" as const,
      dtype: "float32" as const,
      size: [4, 4],
      chunks: [
        { offsets: [0, 0], sizes: [2, 4], data: new Uint8Array(32).fill(1) },
        { offsets: [2, 0], sizes: [2, 4], data: new Uint8Array(32).fill(2) },
      ],
    },
    { fqn: "step", kind: "bytes" as const, data: encoder.encode("7") },
  ];
  const target = new Uint8Array(checkpointCapacity(items));
  return target.subarray(0, packCheckpoint(target, items).length);
}

type Json = Record<string, unknown> & { items: Record<string, unknown>[] };

/**
 * The checkpoint with its metadata document replaced by what `edit` makes of it (as text, so
 * it can be made invalid) and its header changed by `header`, both CRCs then recomputed.
 */
function rewritten(edit: (metadata: Json) => string | Uint8Array, header: (view: DataView) => void = () => undefined): Uint8Array {
  const original = packed();
  const view = new DataView(original.buffer, original.byteOffset);
  const metadataOffset = Number(view.getBigUint64(at.metadataOffset, true));
  const metadata = JSON.parse(new TextDecoder().decode(original.subarray(metadataOffset))) as Json;
  const edited = edit(metadata);
  const document = typeof edited === "string" ? encoder.encode(edited) : edited;
  const out = new Uint8Array(metadataOffset + document.byteLength);
  out.set(original.subarray(0, metadataOffset));
  out.set(document, metadataOffset);
  const outView = new DataView(out.buffer);
  outView.setBigUint64(at.metadataLength, BigInt(document.byteLength), true);
  outView.setBigUint64(at.totalLength, BigInt(out.byteLength), true);
  header(outView);
  outView.setUint32(56, crc32c(out.subarray(Number(outView.getBigUint64(at.metadataOffset, true)))), true);
  outView.setUint32(60, crc32c(out.subarray(0, 60)), true);
  return out;
}

const unchanged = (metadata: Json): string => JSON.stringify(metadata);

/** Edits item `index` of the metadata and serialises the document. */
function item(index: number, edit: (item: Record<string, unknown> & { chunks: Record<string, unknown>[] }) => void) {
  return (metadata: Json): string => {
    edit(metadata.items[index] as Record<string, unknown> & { chunks: Record<string, unknown>[] });
    return JSON.stringify(metadata);
  };
}

describe("the checkpoint reader's structural checks, behind valid checksums", () => {
  it("reads the rewritten checkpoint when nothing is changed, so every rejection below is the rule's", () => {
    const view = readCheckpoint(rewritten(unchanged));
    expect(view.metadata.items.map((entry) => entry.fqn)).toEqual(["w", "step"]);
    expect([...view.bytes("step")]).toEqual([...encoder.encode("7")]);
  });

  it.each<[string, (view: DataView) => void, CheckpointErrorCode, RegExp]>([
    [
      "a format version this reader does not read",
      (h) => h.setUint32(at.version, 2, true),
      "bad_header",
      /^format version 2 is not supported; this reader reads version 1$/,
    ],
    [
      "an alignment that is not a power of two",
      (h) => h.setUint32(at.alignment, 48, true),
      "bad_header",
      /^header alignment 48 is not a power of two of at least 8$/,
    ],
    ["an alignment below 8", (h) => h.setUint32(at.alignment, 4, true), "bad_header", /^header alignment 4 is not/],
    // Data starting inside the header would let items alias the header's bytes.
    [
      "data that starts inside the header",
      (h) => h.setBigUint64(at.dataOffset, 0n, true),
      "bad_header",
      /^header places data at 0\+\d+ .* alignment 64 puts data at 64 /,
    ],
    [
      "metadata that overlaps the data",
      (h) => h.setBigUint64(at.dataLength, h.getBigUint64(at.dataLength, true) + 64n, true),
      "bad_header",
      /^header places data at 64\+\d+ and metadata at 256; alignment 64 puts data at 64 and metadata at 320$/,
    ],
    [
      "a total length that is not where the metadata ends",
      (h) => h.setBigUint64(at.totalLength, h.getBigUint64(at.totalLength, true) - 1n, true),
      "bad_header",
      /^header claims \d+ bytes \(metadata at 256\+\d+\) but the source holds \d+$/,
    ],
  ])("rejects a header with %s", (_, header, code, message) => {
    const error = thrown(() => readCheckpoint(rewritten(unchanged, header)));
    expect(error.code).toBe(code);
    expect(error.message).toMatch(message);
  });

  it.each<[string, (metadata: Json) => string | Uint8Array, RegExp]>([
    ["bytes that are not UTF-8", () => Uint8Array.of(0x7b, 0xff, 0x7d), /^metadata is not UTF-8 JSON: /],
    ["a byte-order mark", (metadata) => `\u{feff}${JSON.stringify(metadata)}`, /^metadata is not UTF-8 JSON: /],
    ["text that is not JSON", () => "{items: []}", /^metadata is not UTF-8 JSON: /],
    ["a metadata format version other than 1", (metadata) => JSON.stringify({ ...metadata, formatVersion: 2 }), /^checkpoint metadata at formatVersion: /],
    ["an unknown key on an item", item(1, (entry) => (entry.compressed = true)), /^checkpoint metadata at items\[1\]: unknown field "compressed"/],
    ["an unknown dtype", item(0, (entry) => (entry.dtype = "float24")), /^checkpoint metadata at items\[0\]\.dtype: /],
    ["a tensor without chunks", item(0, (entry) => (entry.chunks = [])), /^checkpoint metadata at items\[0\]\.chunks: /],
    ["a negative storage offset", item(1, (entry) => (entry.storageOffset = -64)), /^checkpoint metadata at items\[1\]\.storageOffset: /],
    ["a checksum wider than 32 bits", item(1, (entry) => (entry.crc32c = 2 ** 32)), /^checkpoint metadata at items\[1\]\.crc32c: /],
    ["a chunk whose rank differs from the tensor's", item(0, (entry) => (entry.size = [16])), /^w chunks\[0\]: rank differs from the tensor's size$/],
    [
      "a chunk whose length is not its shape's",
      item(0, (entry) => Object.assign(entry.chunks[1]!, { sizes: [1, 4] })),
      /^w chunks\[1\]: length 32 does not match float32\[1, 4\]$/,
    ],
    [
      "a chunk past the tensor's size",
      item(0, (entry) => Object.assign(entry.chunks[1]!, { offsets: [3, 0] })),
      /^w chunks\[1\]: extends past the tensor's size \[4, 4\] in dim 0$/,
    ],
    ["storage before the data region", item(1, (entry) => (entry.storageOffset = 0)), /^step: storage \[0, 1\) lies outside the data region \[64, 193\)$/],
    ["storage past the data region", item(1, (entry) => (entry.length = 2)), /^step: storage \[192, 194\) lies outside the data region \[64, 193\)$/],
    [
      "storage that is not aligned",
      item(0, (entry) => Object.assign(entry.chunks[1]!, { storageOffset: 72 })),
      /^w chunks\[1\]: storageOffset 72 is not a multiple of the alignment 64$/,
    ],
    ["two items of one name", item(1, (entry) => (entry.fqn = "w")), /^w: fqn appears twice in the metadata$/],
  ])("rejects metadata with %s", (_, edit, message) => {
    const error = thrown(() => readCheckpoint(rewritten(edit)));
    expect(error.code).toBe("bad_metadata");
    expect(error.message).toMatch(message);
  });
});
