import type { Parallelism } from "../../sdk/protocol/worker.ts";
/**
 * How the controller reaches destination hosts during a migration. The controller decides
 * when; these carry it out. The per-host daemon implements both over its own connection; the
 * transfer engine moves the bytes between the source worker and the destination's buffer.
 */

export interface StagingRequest {
  readonly migration: string;
  /** Destination host. */
  readonly host: number;
  /** Checkpoint size to stage. */
  readonly bytes: number;
  /**
   * The replacement to start now, while the checkpoint is still on its way, so its process
   * start overlaps the transfer. Its registration is held until the move commits.
   */
  readonly replacement: Omit<ReplacementRequest, "migration" | "host" | "token">;
}

/** Where the source sends its checkpoint, and the single-use token that admits it. */
export interface StagingGrant {
  readonly endpoint: string;
  readonly token: string;
}

export interface StagingTransport {
  /** Allocates staging on the destination; rejects when the host cannot take the checkpoint. */
  prepare(request: StagingRequest): Promise<StagingGrant>;
  /** Frees a grant after a rollback; the token stops admitting transfers. */
  release(host: number, token: string): Promise<void>;
}

export interface ReplacementRequest {
  readonly migration: string;
  readonly job: string;
  readonly group: number;
  /** The job's parallelism, which the replacement registers with. */
  readonly parallelism: Parallelism;
  /** The job's replacement command, or null for the daemon's own --launch. */
  readonly launch: readonly string[] | null;
  readonly host: number;
  /** The replacement registers with this token, loading the checkpoint it names. */
  readonly token: string;
}

export interface ReplacementLauncher {
  /** Starts the replacement launcher on the destination; asking twice for one token starts one. */
  spawn(request: ReplacementRequest): Promise<void>;
}
