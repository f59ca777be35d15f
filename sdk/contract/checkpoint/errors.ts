export type CheckpointErrorCode = "invalid_item" | "duplicate_fqn" | "too_small" | "bad_header" | "bad_metadata" | "checksum_mismatch" | "unknown_fqn";

/** A checkpoint that cannot be written or read as asked; `code` says which rule it broke. */
export class CheckpointError extends Error {
  override readonly name = "CheckpointError";
  constructor(
    message: string,
    readonly code: CheckpointErrorCode,
  ) {
    super(message);
  }
}
