import type { PrepareCommand, Prepared, SpawnCommand } from "../../sdk/protocol/commands.ts";
/**
 * How the controller reaches destination hosts during a migration. The controller decides
 * when; these carry it out. The per-host daemon implements both over its own connection; the
 * transfer engine moves the bytes between the source worker and the destination's buffer.
 * Each request is the daemon command's body (`daemon.prepare`, `daemon.spawn`) and the host
 * it goes to.
 */

type ToHost<Command> = Omit<Command, "v" | "id" | "type"> & {
  /** Destination host. */
  readonly host: number;
};

/**
 * A checkpoint of `bytes` to stage, and the replacement to start now, while the checkpoint is
 * still on its way, so its process start overlaps the transfer. Its registration is held
 * until the move commits.
 */
export type StagingRequest = ToHost<PrepareCommand>;

/** Where the source sends its checkpoint, and the single-use token that admits it. */
export type StagingGrant = Pick<Prepared, "endpoint" | "token">;

export interface StagingTransport {
  /** Allocates staging on the destination; rejects when the host cannot take the checkpoint. */
  prepare(request: StagingRequest): Promise<StagingGrant>;
  /** Frees a grant after a rollback; the token stops admitting transfers. */
  release(host: number, token: string): Promise<void>;
}

/** The replacement registers with `token`, loading the checkpoint it names. */
export type ReplacementRequest = ToHost<SpawnCommand>;

export interface ReplacementLauncher {
  /** Starts the replacement launcher on the destination; asking twice for one token starts one. */
  spawn(request: ReplacementRequest): Promise<void>;
}
