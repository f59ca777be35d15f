// The checkpoint layout shared by the TypeScript writer/reader and the Python hook; FORMAT.md
// is the byte-level description, this file is its single source in code.
import { z } from "zod";

export const MAGIC = "MTCKPT01";
export const FORMAT_VERSION = 1;
export const HEADER_BYTES = 64;
export const DEFAULT_ALIGNMENT = 64;

/** Byte offsets of the fixed header fields (all little-endian). */
export const headerField = {
  magic: 0,
  formatVersion: 8,
  alignment: 12,
  dataOffset: 16,
  dataLength: 24,
  metadataOffset: 32,
  metadataLength: 40,
  totalLength: 48,
  metadataCrc32c: 56,
  headerCrc32c: 60,
} as const;

/** Element sizes, keyed by the name PyTorch prints after "torch." (str(torch.float32)). */
export const dtypeBytes = {
  float64: 8,
  float32: 4,
  float16: 2,
  bfloat16: 2,
  float8_e4m3fn: 1,
  float8_e5m2: 1,
  int64: 8,
  int32: 4,
  int16: 2,
  int8: 1,
  uint8: 1,
  bool: 1,
  complex64: 8,
  complex128: 16,
} as const;
export type Dtype = keyof typeof dtypeBytes;
export const dtypeSchema = z.enum(Object.keys(dtypeBytes) as [Dtype, ...Dtype[]]);

const count = z.number().int().nonnegative();
const uint32 = z.number().int().min(0).max(0xffff_ffff);

/** Where one stored blob lives, relative to the start of the checkpoint. */
const storageFields = {
  storageOffset: count,
  length: count,
  crc32c: uint32,
};

/** One stored piece of a tensor: DCP's ChunkStorageMetadata plus where its bytes are. */
export const chunkSchema = z.strictObject({
  offsets: z.array(count),
  sizes: z.array(count),
  ...storageFields,
});
export type ChunkMetadata = z.infer<typeof chunkSchema>;

/** DCP's TensorStorageMetadata: global size and the chunks this checkpoint holds. */
export const tensorItemSchema = z.strictObject({
  fqn: z.string().min(1),
  kind: z.literal("tensor"),
  dtype: dtypeSchema,
  size: z.array(count),
  chunks: z.array(chunkSchema).min(1),
});
export type TensorItemMetadata = z.infer<typeof tensorItemSchema>;

/** DCP's BytesStorageMetadata: an opaque blob (pickled objects, RNG state, a JSON document). */
export const bytesItemSchema = z.strictObject({
  fqn: z.string().min(1),
  kind: z.literal("bytes"),
  ...storageFields,
});
export type BytesItemMetadata = z.infer<typeof bytesItemSchema>;

export const itemSchema = z.discriminatedUnion("kind", [tensorItemSchema, bytesItemSchema]);
export type ItemMetadata = z.infer<typeof itemSchema>;

export const metadataSchema = z.strictObject({
  formatVersion: z.literal(FORMAT_VERSION),
  items: z.array(itemSchema),
});
export type CheckpointMetadata = z.infer<typeof metadataSchema>;

export function alignUp(value: number, alignment: number): number {
  return Math.ceil(value / alignment) * alignment;
}

export function elementCount(sizes: readonly number[]): number {
  return sizes.reduce((product, n) => product * n, 1);
}
