import { performance } from "node:perf_hooks";
import { send, StagingBuffer, type Transport } from "../../native/index.ts";
import { packCheckpointAsync, readCheckpoint, type CheckpointItemInput, type CheckpointView } from "../contract/checkpoint/index.ts";
import { ticketFor } from "../contract/protocol/endpoint.ts";
import { formatZodError } from "../contract/errors.ts";
import { ReplacementEnvSchema, type ReplacementEnv } from "../contract/protocol/replacement.ts";
import type { Directive } from "../contract/protocol/worker.ts";

/**
 * The two ends of a worker's move, for launchers written in TypeScript: the source packs its
 * state and writes it into the destination's staging buffer; the replacement the destination's
 * daemon starts maps that buffer and reads the state back, without a copy.
 */

export type MigrateOut = Extract<Directive, { kind: "migrate-out" }>;

/** A replacement's environment is missing a variable or holds a bad value. */
export class ReplacementEnvironmentError extends Error {
  override readonly name = "ReplacementEnvironmentError";
}

/**
 * The migration this process was started for, or null when it is a fresh start (no
 * MONKEYTREE_TOKEN in the environment).
 */
export function replacementFromEnv(env: NodeJS.ProcessEnv = process.env): ReplacementEnv | null {
  if (env.MONKEYTREE_TOKEN === undefined) return null;
  const parsed = ReplacementEnvSchema.safeParse(env);
  if (!parsed.success) {
    throw new ReplacementEnvironmentError(
      `${formatZodError("replacement environment", parsed.error)}; a replacement gets these from the daemon that starts it`,
    );
  }
  return parsed.data;
}

export interface StagedCheckpoint {
  /** The checkpoint, read in place; every item's CRC32C was verified. */
  readonly view: CheckpointView;
  /** Unmaps the staging buffer; views into it are detached from then on. */
  close(): void;
}

/**
 * Maps the daemon's staging buffer and reads the checkpoint staged for this replacement. Call
 * it after registering: a daemon starts the replacement while the checkpoint is still on its
 * way, and the controller answers its registration only once the move has committed.
 */
export function openStagedCheckpoint(replacement: ReplacementEnv): StagedCheckpoint {
  const buffer = StagingBuffer.open(replacement.MONKEYTREE_STAGING_BUFFER, { lock: false });
  try {
    const view = readCheckpoint(buffer.bytes(replacement.MONKEYTREE_STAGING_OFFSET, replacement.MONKEYTREE_STAGING_LENGTH));
    return { view, close: () => buffer.free() };
  } catch (error) {
    buffer.free();
    throw error;
  }
}

export interface SendCheckpointOptions {
  /** The checkpoint size the worker registered with: what the destination staged for it. */
  readonly bytes: number;
  readonly streams?: number;
  readonly onProgress?: (bytesSent: number) => void;
  /** Bytes between progress calls (default 64 MiB). */
  readonly progressEvery?: number;
}

export interface SentCheckpoint {
  readonly bytes: number;
  readonly packSeconds: number;
  readonly sendSeconds: number;
  /** How the bytes travelled: RDMA where both hosts have a device, TCP otherwise. */
  readonly transport: Transport;
}

/**
 * Packs `items` into a staging buffer of the registered size and writes it into the range the
 * `migrate-out` directive grants. Afterwards call `barrier` with the same step again: the
 * controller answers `stop` once the move committed, `continue` if it rolled back.
 */
export async function sendCheckpoint(directive: MigrateOut, items: readonly CheckpointItemInput[], options: SendCheckpointOptions): Promise<SentCheckpoint> {
  const buffer = StagingBuffer.create({ size: options.bytes, lock: false });
  try {
    const packStart = performance.now();
    await packCheckpointAsync(buffer.bytes(0, options.bytes), items);
    const packSeconds = (performance.now() - packStart) / 1000;
    const result = await send({
      ticket: ticketFor(directive.endpoint, directive.token, options.bytes),
      buffer,
      ...(options.streams === undefined ? {} : { streams: options.streams }),
      ...(options.onProgress === undefined ? {} : { onProgress: options.onProgress }),
      ...(options.progressEvery === undefined ? {} : { progressEvery: options.progressEvery }),
    });
    return { bytes: result.bytes, packSeconds, sendSeconds: result.seconds, transport: result.transport };
  } finally {
    buffer.free();
  }
}
