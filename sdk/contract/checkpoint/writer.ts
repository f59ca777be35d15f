// Packs named tensors and blobs into one contiguous checkpoint (see FORMAT.md): header, aligned
// item storage, then the metadata document, so a staging buffer can be filled in one pass.
import { copyWithCrc32c, copyWithCrc32cAsync, crc32c } from "../../../native/index.ts";
import { CheckpointError } from "./errors.ts";
import {
  DEFAULT_ALIGNMENT,
  FORMAT_VERSION,
  HEADER_BYTES,
  MAGIC,
  alignUp,
  dtypeBytes,
  elementCount,
  headerField,
  type CheckpointMetadata,
  type Dtype,
  type ItemMetadata,
} from "./format.ts";

export interface TensorChunkInput {
  /** Where this chunk starts in the global tensor (default: all zeros). */
  offsets?: readonly number[];
  sizes: readonly number[];
  /** Row-major, little-endian elements: product(sizes) * element size bytes. */
  data: Uint8Array;
}

export type CheckpointItemInput =
  | { fqn: string; kind: "tensor"; dtype: Dtype; size?: readonly number[]; chunks: readonly TensorChunkInput[] }
  | { fqn: string; kind: "bytes"; data: Uint8Array };

export interface PackOptions {
  /** Alignment of every stored blob, a power of two ≥ 8 (default 64). */
  alignment?: number;
}

export interface PackResult {
  /** Bytes written from the start of the target. */
  length: number;
  metadata: CheckpointMetadata;
}

interface Placed {
  metadata: ItemMetadata;
  blobs: { data: Uint8Array; storageOffset: number; slot: { crc32c: number } }[];
}

interface Layout {
  alignment: number;
  dataOffset: number;
  dataEnd: number;
  metadataOffset: number;
  items: Placed[];
}

const MAX_CRC = 0xffff_ffff;
const encoder = new TextEncoder();

function checkAlignment(alignment: number): number {
  if (!Number.isInteger(alignment) || alignment < 8 || (alignment & (alignment - 1)) !== 0) {
    throw new RangeError(`alignment must be a power of two of at least 8, received ${alignment}`);
  }
  return alignment;
}

function checkShape(fqn: string, what: string, values: readonly number[]): number[] {
  if (!values.every((n) => Number.isSafeInteger(n) && n >= 0)) {
    throw new CheckpointError(`${fqn}: ${what} must be non-negative integers, received [${values.join(", ")}]`, "invalid_item");
  }
  return [...values];
}

function placeTensor(item: Extract<CheckpointItemInput, { kind: "tensor" }>, cursor: { next: number }, alignment: number): Placed {
  const element = dtypeBytes[item.dtype];
  if (element === undefined) {
    throw new CheckpointError(`${item.fqn}: unknown dtype ${JSON.stringify(item.dtype)}; use one of ${Object.keys(dtypeBytes).join(", ")}`, "invalid_item");
  }
  if (item.chunks.length === 0) throw new CheckpointError(`${item.fqn}: a tensor needs at least one chunk`, "invalid_item");
  const firstSizes = item.chunks[0]?.sizes ?? [];
  const size = checkShape(item.fqn, "size", item.size ?? firstSizes);
  const placed: Placed = { metadata: { fqn: item.fqn, kind: "tensor", dtype: item.dtype, size, chunks: [] }, blobs: [] };
  for (const [index, chunk] of item.chunks.entries()) {
    const sizes = checkShape(item.fqn, `chunks[${index}].sizes`, chunk.sizes);
    const offsets = checkShape(item.fqn, `chunks[${index}].offsets`, chunk.offsets ?? sizes.map(() => 0));
    if (sizes.length !== size.length || offsets.length !== size.length) {
      throw new CheckpointError(`${item.fqn}: chunks[${index}] has ${sizes.length} dims but the tensor has ${size.length}`, "invalid_item");
    }
    const outside = sizes.findIndex((n, dim) => (offsets[dim] ?? 0) + n > (size[dim] ?? 0));
    if (outside >= 0) {
      throw new CheckpointError(`${item.fqn}: chunks[${index}] extends past the tensor's size in dim ${outside}`, "invalid_item");
    }
    const length = elementCount(sizes) * element;
    if (chunk.data.byteLength !== length) {
      throw new CheckpointError(
        `${item.fqn}: chunks[${index}] holds ${chunk.data.byteLength} bytes but ${item.dtype}[${sizes.join(", ")}] needs ${length}`,
        "invalid_item",
      );
    }
    const storageOffset = alignUp(cursor.next, alignment);
    cursor.next = storageOffset + length;
    const slot = { offsets, sizes, storageOffset, length, crc32c: MAX_CRC };
    if (placed.metadata.kind === "tensor") placed.metadata.chunks.push(slot);
    placed.blobs.push({ data: chunk.data, storageOffset, slot });
  }
  return placed;
}

function plan(items: readonly CheckpointItemInput[], options: PackOptions): Layout {
  const alignment = checkAlignment(options.alignment ?? DEFAULT_ALIGNMENT);
  const dataOffset = alignUp(HEADER_BYTES, alignment);
  const cursor = { next: dataOffset };
  const seen = new Set<string>();
  const placedItems: Placed[] = [];
  for (const item of items) {
    if (typeof item.fqn !== "string" || item.fqn.length === 0) {
      throw new CheckpointError("every item needs a non-empty fqn", "invalid_item");
    }
    if (seen.has(item.fqn)) throw new CheckpointError(`${item.fqn}: fqn appears twice; each item needs its own name`, "duplicate_fqn");
    seen.add(item.fqn);
    if (item.kind === "tensor") {
      placedItems.push(placeTensor(item, cursor, alignment));
    } else {
      const storageOffset = alignUp(cursor.next, alignment);
      cursor.next = storageOffset + item.data.byteLength;
      const metadata = { fqn: item.fqn, kind: "bytes" as const, storageOffset, length: item.data.byteLength, crc32c: MAX_CRC };
      placedItems.push({ metadata, blobs: [{ data: item.data, storageOffset, slot: metadata }] });
    }
  }
  return { alignment, dataOffset, dataEnd: cursor.next, metadataOffset: alignUp(cursor.next, alignment), items: placedItems };
}

function encodeMetadata(layout: Layout): Uint8Array {
  const metadata: CheckpointMetadata = { formatVersion: FORMAT_VERSION, items: layout.items.map((item) => item.metadata) };
  return encoder.encode(JSON.stringify(metadata));
}

/**
 * An upper bound on the bytes packCheckpoint writes for these items: size a staging buffer
 * with it before packing.
 */
export function checkpointCapacity(items: readonly CheckpointItemInput[], options: PackOptions = {}): number {
  const layout = plan(items, options);
  // Checksums are still the widest placeholder here, so the document cannot grow later.
  return layout.metadataOffset + encodeMetadata(layout).byteLength;
}

/** Plans the layout and checks that it fits in `target`, before a single byte is written. */
function prepare(target: Uint8Array, items: readonly CheckpointItemInput[], options: PackOptions): Layout {
  const layout = plan(items, options);
  const capacity = layout.metadataOffset + encodeMetadata(layout).byteLength;
  if (capacity > target.byteLength) {
    throw new CheckpointError(
      `the checkpoint needs up to ${capacity} bytes but the target holds ${target.byteLength}; size it with checkpointCapacity()`,
      "too_small",
    );
  }
  return layout;
}

interface Copy {
  blob: Placed["blobs"][number];
  destination: Uint8Array;
}

/**
 * Every blob with the range of `target` it is copied into, in storage order. Zeroes the padding
 * around them on the way, so the same items always give the same bytes.
 */
function copiesInto(target: Uint8Array, layout: Layout): Copy[] {
  const copies: Copy[] = [];
  let written = 0;
  for (const item of layout.items) {
    for (const blob of item.blobs) {
      target.fill(0, written, blob.storageOffset);
      copies.push({ blob, destination: target.subarray(blob.storageOffset, blob.storageOffset + blob.data.byteLength) });
      written = blob.storageOffset + blob.data.byteLength;
    }
  }
  target.fill(0, written, layout.metadataOffset);
  return copies;
}

/** Writes the metadata document (with the blobs' checksums, now known) and then the header. */
function finish(target: Uint8Array, layout: Layout): PackResult {
  const metadataBytes = encodeMetadata(layout);
  target.set(metadataBytes, layout.metadataOffset);
  const length = layout.metadataOffset + metadataBytes.byteLength;

  const header = new DataView(target.buffer, target.byteOffset, HEADER_BYTES);
  encoder.encodeInto(MAGIC, target.subarray(headerField.magic, headerField.magic + MAGIC.length));
  header.setUint32(headerField.formatVersion, FORMAT_VERSION, true);
  header.setUint32(headerField.alignment, layout.alignment, true);
  header.setBigUint64(headerField.dataOffset, BigInt(layout.dataOffset), true);
  header.setBigUint64(headerField.dataLength, BigInt(layout.dataEnd - layout.dataOffset), true);
  header.setBigUint64(headerField.metadataOffset, BigInt(layout.metadataOffset), true);
  header.setBigUint64(headerField.metadataLength, BigInt(metadataBytes.byteLength), true);
  header.setBigUint64(headerField.totalLength, BigInt(length), true);
  header.setUint32(headerField.metadataCrc32c, crc32c(metadataBytes), true);
  header.setUint32(headerField.headerCrc32c, crc32c(target.subarray(0, headerField.headerCrc32c)), true);
  return { length, metadata: { formatVersion: FORMAT_VERSION, items: layout.items.map((item) => item.metadata) } };
}

/**
 * Writes the checkpoint at the start of `target`, checksumming every blob while copying it, on
 * the calling (JS) thread: for small checkpoints; use packCheckpointAsync for large ones.
 */
export function packCheckpoint(target: Uint8Array, items: readonly CheckpointItemInput[], options: PackOptions = {}): PackResult {
  const layout = prepare(target, items, options);
  for (const { blob, destination } of copiesInto(target, layout)) blob.slot.crc32c = copyWithCrc32c(destination, blob.data);
  return finish(target, layout);
}

/**
 * packCheckpoint with the blob copies and their checksums on a worker thread, so the event loop
 * keeps running while gigabytes are copied; the bytes written are the same. Planning, padding,
 * metadata and header (all small) stay on the JS thread. Neither `target` nor the items' data
 * may be changed, freed or transferred until the promise settles (a staging buffer's free()
 * refuses with `buffer_busy` meanwhile). Rejects with the same errors packCheckpoint throws.
 */
export async function packCheckpointAsync(target: Uint8Array, items: readonly CheckpointItemInput[], options: PackOptions = {}): Promise<PackResult> {
  const layout = prepare(target, items, options);
  const copies = copiesInto(target, layout);
  const crcs = await copyWithCrc32cAsync(copies.map(({ blob, destination }) => [destination, blob.data] as const));
  copies.forEach(({ blob }, index) => {
    blob.slot.crc32c = crcs[index] ?? MAX_CRC;
  });
  return finish(target, layout);
}
