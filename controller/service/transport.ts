import type { PrepareCommand, Prepared, SpawnCommand } from "../../sdk/contract/protocol/commands.ts";
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

/**
 * The cluster's scheduler, where one owns the hosts (Slurm): the controller keeps its books
 * right around every move, so it never hands a destination to another job nor keeps a vacated
 * source busy. Jobs are named by their MonkeyTree id, which under Slurm is the Slurm job id.
 * Each call is idempotent: a restarted controller may make it again.
 */
/** What the scheduler says of the cluster: jobs MonkeyTree must count but never move, hosts no worker may move to, its holds. */
export interface SchedulerView {
  readonly pinned: readonly { readonly id: string; readonly rings: number; readonly hosts: readonly number[] }[];
  readonly unavailable: readonly { readonly host: number; readonly why: string }[];
  readonly holds: readonly { readonly name: string; readonly job: string; readonly node: string; readonly host: number | null }[];
  /** Ids of the scheduler's jobs that still run (or wait): a MonkeyTree job seen here and later missing has ended. */
  readonly live: readonly string[];
  /** The hosts each live job is allocated. */
  readonly allocations: readonly { readonly job: string; readonly hosts: readonly number[] }[];
}

export interface HostScheduler {
  /** A fresh look at the cluster; releases the holds of jobs that ended. */
  view(): Promise<SchedulerView>;
  /**
   * Before a move asks its destination for staging: the scheduler starts no other job on `host`.
   * Resolves with the job's user where the scheduler knows it: its replacement runs as that user.
   */
  hold(job: string, migration: string, host: number): Promise<{ readonly user: string | null } | void>;
  /** The move rolled back: its destination is the scheduler's again. */
  release(job: string, migration: string): Promise<unknown>;
  /** The move committed: the job no longer uses `host`, its source. */
  giveBack(job: string, host: number): Promise<unknown>;
}
