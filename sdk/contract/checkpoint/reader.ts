// Reads a checkpoint in place (see FORMAT.md): checks the header, parses the metadata with its
// zod schema, bounds-checks every item, and hands out views into the source without copying.
import { crc32c } from "../../../native/index.ts";
import { InvalidInputError } from "../errors.ts";
import { CheckpointError } from "./errors.ts";
import {
  FORMAT_VERSION,
  HEADER_BYTES,
  MAGIC,
  alignUp,
  dtypeBytes,
  elementCount,
  headerField,
  metadataSchema,
  type CheckpointMetadata,
  type ItemMetadata,
} from "./format.ts";

export interface ReadOptions {
  /** Verify every item's CRC32C up front (default true). */
  verify?: boolean;
}

export interface TensorChunkView {
  offsets: number[];
  sizes: number[];
  data: Uint8Array;
}

export interface CheckpointView {
  metadata: CheckpointMetadata;
  /** Bytes the checkpoint occupies from the start of the source. */
  length: number;
  bytes(fqn: string): Uint8Array;
  chunks(fqn: string): TensorChunkView[];
}

// ignoreBOM keeps a byte-order mark in the text, so JSON.parse rejects it as FORMAT.md (and the
// Python reader) does instead of silently dropping it.
const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

function readHeader(source: Uint8Array) {
  if (source.byteLength < HEADER_BYTES) {
    throw new CheckpointError(`source holds ${source.byteLength} bytes, less than the ${HEADER_BYTES}-byte header`, "bad_header");
  }
  const magic = decoder.decode(source.subarray(0, MAGIC.length));
  if (magic !== MAGIC) throw new CheckpointError(`not a MonkeyTree checkpoint: magic ${JSON.stringify(magic)}, expected "${MAGIC}"`, "bad_header");
  const view = new DataView(source.buffer, source.byteOffset, HEADER_BYTES);
  const stored = view.getUint32(headerField.headerCrc32c, true);
  const actual = crc32c(source.subarray(0, headerField.headerCrc32c));
  if (stored !== actual) throw new CheckpointError(`header CRC32C is 0x${actual.toString(16)}, header says 0x${stored.toString(16)}`, "checksum_mismatch");
  const version = view.getUint32(headerField.formatVersion, true);
  if (version !== FORMAT_VERSION) {
    throw new CheckpointError(`format version ${version} is not supported; this reader reads version ${FORMAT_VERSION}`, "bad_header");
  }
  const u64 = (offset: number): number => Number(view.getBigUint64(offset, true));
  const header = {
    alignment: view.getUint32(headerField.alignment, true),
    dataOffset: u64(headerField.dataOffset),
    dataLength: u64(headerField.dataLength),
    metadataOffset: u64(headerField.metadataOffset),
    metadataLength: u64(headerField.metadataLength),
    totalLength: u64(headerField.totalLength),
    metadataCrc32c: view.getUint32(headerField.metadataCrc32c, true),
  };
  if (header.totalLength > source.byteLength || header.metadataOffset + header.metadataLength !== header.totalLength) {
    throw new CheckpointError(
      `header claims ${header.totalLength} bytes (metadata at ${header.metadataOffset}+${header.metadataLength}) but the source holds ${source.byteLength}`,
      "bad_header",
    );
  }
  const { alignment, dataOffset, dataLength, metadataOffset } = header;
  if (alignment < 8 || (alignment & (alignment - 1)) !== 0) {
    throw new CheckpointError(`header alignment ${alignment} is not a power of two of at least 8`, "bad_header");
  }
  const expected = { dataOffset: alignUp(HEADER_BYTES, alignment), metadataOffset: alignUp(dataOffset + dataLength, alignment) };
  if (dataOffset !== expected.dataOffset || metadataOffset !== expected.metadataOffset) {
    throw new CheckpointError(
      `header places data at ${dataOffset}+${dataLength} and metadata at ${metadataOffset}; alignment ${alignment} puts data at ${expected.dataOffset} and metadata at ${expected.metadataOffset}`,
      "bad_header",
    );
  }
  return header;
}

function parseMetadata(bytes: Uint8Array): CheckpointMetadata {
  let document: unknown;
  try {
    document = JSON.parse(decoder.decode(bytes));
  } catch (cause) {
    throw new CheckpointError(`metadata is not UTF-8 JSON: ${(cause as Error).message}`, "bad_metadata");
  }
  const parsed = metadataSchema.safeParse(document);
  if (!parsed.success) throw new CheckpointError(InvalidInputError.fromZod("checkpoint metadata", parsed.error).message, "bad_metadata");
  return parsed.data;
}

function storedRanges(item: ItemMetadata): { storageOffset: number; length: number; crc32c: number; what: string }[] {
  if (item.kind === "bytes") return [{ ...item, what: item.fqn }];
  const element = dtypeBytes[item.dtype];
  return item.chunks.map((chunk, index) => {
    const what = `${item.fqn} chunks[${index}]`;
    if (chunk.sizes.length !== item.size.length || chunk.offsets.length !== item.size.length) {
      throw new CheckpointError(`${what}: rank differs from the tensor's size`, "bad_metadata");
    }
    const outside = chunk.sizes.findIndex((n, dim) => (chunk.offsets[dim] ?? 0) + n > (item.size[dim] ?? 0));
    if (outside >= 0) {
      throw new CheckpointError(`${what}: extends past the tensor's size [${item.size.join(", ")}] in dim ${outside}`, "bad_metadata");
    }
    if (elementCount(chunk.sizes) * element !== chunk.length) {
      throw new CheckpointError(`${what}: length ${chunk.length} does not match ${item.dtype}[${chunk.sizes.join(", ")}]`, "bad_metadata");
    }
    return { ...chunk, what };
  });
}

/** Opens the checkpoint at the start of `source`; item views alias `source`. */
export function readCheckpoint(source: Uint8Array, options: ReadOptions = {}): CheckpointView {
  const header = readHeader(source);
  const metadataBytes = source.subarray(header.metadataOffset, header.totalLength);
  const metadataCrc = crc32c(metadataBytes);
  if (metadataCrc !== header.metadataCrc32c) {
    throw new CheckpointError(`metadata CRC32C is 0x${metadataCrc.toString(16)}, header says 0x${header.metadataCrc32c.toString(16)}`, "checksum_mismatch");
  }
  const metadata = parseMetadata(metadataBytes);
  const dataEnd = header.dataOffset + header.dataLength;
  const byFqn = new Map<string, ItemMetadata>();
  for (const item of metadata.items) {
    if (byFqn.has(item.fqn)) throw new CheckpointError(`${item.fqn}: fqn appears twice in the metadata`, "bad_metadata");
    byFqn.set(item.fqn, item);
    for (const range of storedRanges(item)) {
      if (range.storageOffset < header.dataOffset || range.storageOffset + range.length > dataEnd) {
        throw new CheckpointError(
          `${range.what}: storage [${range.storageOffset}, ${range.storageOffset + range.length}) lies outside the data region [${header.dataOffset}, ${dataEnd})`,
          "bad_metadata",
        );
      }
      if (range.storageOffset % header.alignment !== 0) {
        throw new CheckpointError(`${range.what}: storageOffset ${range.storageOffset} is not a multiple of the alignment ${header.alignment}`, "bad_metadata");
      }
      if (options.verify ?? true) {
        const actual = crc32c(source.subarray(range.storageOffset, range.storageOffset + range.length));
        if (actual !== range.crc32c) {
          throw new CheckpointError(`${range.what}: CRC32C is 0x${actual.toString(16)}, metadata says 0x${range.crc32c.toString(16)}`, "checksum_mismatch");
        }
      }
    }
  }
  const find = <K extends ItemMetadata["kind"]>(fqn: string, kind: K): Extract<ItemMetadata, { kind: K }> => {
    const item = byFqn.get(fqn);
    if (!item) throw new CheckpointError(`no item named ${JSON.stringify(fqn)} in this checkpoint`, "unknown_fqn");
    if (item.kind !== kind) throw new CheckpointError(`${fqn} is a ${item.kind} item, not ${kind}`, "unknown_fqn");
    return item as Extract<ItemMetadata, { kind: K }>;
  };
  return {
    metadata,
    length: header.totalLength,
    bytes(fqn) {
      const item = find(fqn, "bytes");
      return source.subarray(item.storageOffset, item.storageOffset + item.length);
    },
    chunks(fqn) {
      return find(fqn, "tensor").chunks.map((chunk) => ({
        offsets: chunk.offsets,
        sizes: chunk.sizes,
        data: source.subarray(chunk.storageOffset, chunk.storageOffset + chunk.length),
      }));
    },
  };
}
