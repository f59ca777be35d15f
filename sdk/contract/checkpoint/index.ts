export { CheckpointError, type CheckpointErrorCode } from "./errors.ts";
export {
  DEFAULT_ALIGNMENT,
  FORMAT_VERSION,
  HEADER_BYTES,
  MAGIC,
  dtypeBytes,
  metadataSchema,
  type CheckpointMetadata,
  type ChunkMetadata,
  type Dtype,
  type ItemMetadata,
} from "./format.ts";
export {
  checkpointCapacity,
  packCheckpoint,
  packCheckpointAsync,
  type CheckpointItemInput,
  type PackOptions,
  type PackResult,
  type TensorChunkInput,
} from "./writer.ts";
export { readCheckpoint, type CheckpointView, type ReadOptions, type TensorChunkView } from "./reader.ts";
