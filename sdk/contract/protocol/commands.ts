import { z } from "zod";
import { TransferEndpointSchema } from "./endpoint.ts";
import { envelope, HostSchema, JobIdSchema } from "./envelope.ts";
import { ReplacementNameSchema, UserNameSchema } from "./replacement.ts";
import { idSchema, intSchema, MAX_HOSTS, textSchema } from "./limits.ts";
import { AssignmentSchema, ParallelismSchema } from "./worker.ts";

/**
 * Controller → daemon: commands the controller sends over its ROUTER to a registered daemon's
 * routing identity. Their ids come from the controller's own counter, so they never collide
 * with the daemon's requests; each command is answered once, by `daemon.prepared`,
 * `daemon.done` or `daemon.refused` carrying the command's id.
 */

/**
 * Who replaces the moved worker: the job, its stage and parallelism, where it will sit in the
 * job, and which configured command starts it.
 */
const ReplacementSpecSchema = z.strictObject({
  job: JobIdSchema,
  group: intSchema("group", 0, MAX_HOSTS - 1),
  parallelism: ParallelismSchema,
  /**
   * The replacement's node rank and the job's node count once the move commits. At prepare a
   * forecast (another change to the job may commit first): enough for the replacement to build
   * its share of a sharded model before the job stops, which its attach confirms or corrects.
   */
  place: AssignmentSchema.pick({ nodeRank: true, nodes: true }),
  /** The daemon's --replacement the job named; null when it named none, which the daemon refuses. */
  replacement: ReplacementNameSchema.nullable(),
  /**
   * The job's own user, whom the daemon starts the replacement as and gives its staging to;
   * null when the controller knows none (no Slurm record, no `monkeytree keys --job J --user U`),
   * and the daemon falls back to its `--run-as` user, shared by every such job on the host.
   */
  user: UserNameSchema.nullable().default(null),
});

/**
 * Stage `bytes` of checkpoint for a migration into the host's staging buffer, and start the
 * replacement launcher at once: its start overlaps the transfer, and the controller holds its
 * registration until the move commits (a rollback releases the staging and stops it).
 */
export const PrepareCommandSchema = z.strictObject({
  ...envelope("daemon.prepare"),
  migration: idSchema("migration"),
  bytes: z.int({ error: "bytes must be a whole number" }).min(1, { error: "a checkpoint to stage has at least 1 byte" }),
  replacement: ReplacementSpecSchema,
});
export type PrepareCommand = z.infer<typeof PrepareCommandSchema>;

/** Withdraw a grant after a rollback; its token stops admitting transfers and its range is freed. */
export const ReleaseCommandSchema = z.strictObject({ ...envelope("daemon.release"), token: idSchema("token") });
export type ReleaseCommand = z.infer<typeof ReleaseCommandSchema>;

/**
 * Start the replacement launcher for a committed move, unless it already runs (started at
 * prepare): a second spawn for one token starts nothing.
 */
export const SpawnCommandSchema = z.strictObject({
  ...envelope("daemon.spawn"),
  migration: idSchema("migration"),
  // Who it runs as was settled at prepare, where its staging was given to that user.
  ...ReplacementSpecSchema.omit({ user: true }).shape,
  token: idSchema("token"),
});
export type SpawnCommand = z.infer<typeof SpawnCommandSchema>;

export const CommandSchema = z.discriminatedUnion("type", [PrepareCommandSchema, ReleaseCommandSchema, SpawnCommandSchema]);
export type Command = z.infer<typeof CommandSchema>;

/** The grant: the source writes to `endpoint` (the destination's transfer engine) with `token`. */
export const PreparedSchema = z.strictObject({
  ...envelope("daemon.prepared"),
  host: HostSchema,
  endpoint: TransferEndpointSchema,
  token: idSchema("token"),
});
export type Prepared = z.infer<typeof PreparedSchema>;

/** A release or spawn was carried out. */
export const DoneSchema = z.strictObject({ ...envelope("daemon.done"), host: HostSchema });
export type Done = z.infer<typeof DoneSchema>;

/**
 * Why a daemon would not carry out a command: `no_space` (the buffer has no free range that
 * large), `unknown_token`, `not_staged` (spawn before the checkpoint was verified),
 * `unknown_replacement` (the job named no replacement, or one the daemon has no --replacement
 * for), `run_as_required` (the daemon runs as root, the job has no user and the daemon no
 * --run-as, and it starts nothing as root), `unknown_user` (the job's user is not one this host
 * can start a replacement as: unknown here, root, or another user than a daemon that cannot
 * switch users runs as), `launch_failed`, `malformed`.
 */
export const RefusalCodeSchema = z.enum([
  "no_space",
  "unknown_token",
  "not_staged",
  "unknown_replacement",
  "run_as_required",
  "unknown_user",
  "launch_failed",
  "malformed",
]);
export type RefusalCode = z.infer<typeof RefusalCodeSchema>;

export const RefusedSchema = z.strictObject({
  ...envelope("daemon.refused"),
  host: HostSchema,
  code: RefusalCodeSchema,
  message: textSchema("message"),
});
export type Refused = z.infer<typeof RefusedSchema>;

export const CommandReplySchema = z.discriminatedUnion("type", [PreparedSchema, DoneSchema, RefusedSchema]);
export type CommandReply = z.infer<typeof CommandReplySchema>;
