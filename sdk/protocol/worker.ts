import { z } from "zod";
import { envelope, HostSchema, JobIdSchema } from "./envelope.ts";
import { ReplacementNameSchema } from "./replacement.ts";

/** Worker ↔ controller: launchers register their worker and meet the controller at every barrier. */

const whole = (what: string) => z.int({ error: `${what} must be a whole number` });
const positive = (what: string) => whole(what).min(1, { error: `${what} must be at least 1` });

/** Which worker a message is about: one host's share of one group (pipeline stage) of a job. */
export const WorkerIdentitySchema = z.strictObject({
  job: JobIdSchema,
  /** Pipeline stage, 0 ≤ group < parallelism.pp. */
  group: whole("group").min(0, { error: "group indices start at 0" }),
  host: HostSchema,
});
export type WorkerIdentity = z.infer<typeof WorkerIdentitySchema>;

/**
 * How the job is split. `tp` ranks of a tensor-parallel group stay inside one host; `pp` is
 * the number of pipeline stages (groups); `dp` is the number of hosts in each stage, the DP
 * replicas that all-reduce together. The job has `pp × dp` workers.
 */
export const ParallelismSchema = z.strictObject({
  tp: positive("parallelism.tp"),
  pp: positive("parallelism.pp"),
  dp: positive("parallelism.dp"),
});
export type Parallelism = z.infer<typeof ParallelismSchema>;

export const RegisterSchema = z.strictObject({
  ...envelope("worker.register"),
  worker: WorkerIdentitySchema,
  parallelism: ParallelismSchema,
  /** DP rings crossing a rack boundary per fragmented rack; defaults to `parallelism.tp`. */
  rings: positive("rings").optional(),
  /** Size of this worker's checkpoint: what a destination must stage to receive it. */
  checkpointBytes: whole("checkpointBytes").min(0, { error: "checkpointBytes must not be negative" }),
  /** Set by a replacement launcher a daemon spawned for a migration: the migration's single-use token. */
  token: z.string().min(1).optional(),
  /**
   * The name of the replacement command the destination's daemon is configured with
   * (`--replacement NAME=COMMAND`); the daemon runs it with the migration's MONKEYTREE_*
   * environment, which supplies the job, host and parallelism. Without one, moves of the job roll back.
   */
  replacement: ReplacementNameSchema.optional(),
});
export type Register = z.infer<typeof RegisterSchema>;

export const BarrierSchema = z.strictObject({
  ...envelope("worker.barrier"),
  worker: WorkerIdentitySchema,
  /** The iteration that just ended. */
  step: whole("step").min(0, { error: "step must not be negative" }),
  /** Generation of the assignment the worker runs with; an older one gets `reconfigure`. */
  generation: whole("generation").min(0, { error: "generation must not be negative" }),
});
export type Barrier = z.infer<typeof BarrierSchema>;

/** A launcher reports that its job ended; its hosts become free. */
export const FinishSchema = z.strictObject({
  ...envelope("job.finish"),
  job: JobIdSchema,
});
export type Finish = z.infer<typeof FinishSchema>;

/** Where a worker sits in its job: its torchrun node rank and the ring order it follows. */
export const AssignmentSchema = z.strictObject({
  job: JobIdSchema,
  group: whole("group").min(0),
  host: HostSchema,
  /** `group × dp + position in the group's ring order`. */
  nodeRank: whole("nodeRank").min(0),
  /** Workers in the job (`pp × dp`). */
  nodes: positive("nodes"),
  /** Host of node rank 0, where the job's rendezvous store runs. */
  masterHost: HostSchema,
  /** The master host's network address, as its daemon advertises it; null when it runs no daemon. */
  masterAddress: z.string().nullable(),
  /** Host order of this worker's DP ring(s). */
  ringOrder: z.array(HostSchema),
  /** Increases every time the job's membership or order changes. */
  generation: whole("generation").min(0),
  /** The barrier step the job resumes after; null at a fresh start. */
  resumeStep: whole("resumeStep").min(0).nullable(),
});
export type Assignment = z.infer<typeof AssignmentSchema>;

export const RegisteredSchema = z.strictObject({
  ...envelope("worker.registered"),
  assignment: AssignmentSchema,
});
export type Registered = z.infer<typeof RegisteredSchema>;

export const DirectiveSchema = z.discriminatedUnion("kind", [
  /** Keep training. */
  z.strictObject({ kind: z.literal("continue") }),
  /** Re-form the process group with a new rank, world size, master or ring order, then continue. */
  z.strictObject({ kind: z.literal("reconfigure"), assignment: AssignmentSchema }),
  /**
   * Checkpoint into the destination's staging buffer, then call `barrier` again with the same
   * step: the controller answers `stop` once the move commits, `continue` if it rolled back.
   */
  z.strictObject({
    kind: z.literal("migrate-out"),
    migration: z.string(),
    to: HostSchema,
    endpoint: z.string(),
    token: z.string(),
    step: whole("step").min(0),
  }),
  /** Exit: this worker's place is taken by its replacement, or the job ended. */
  z.strictObject({ kind: z.literal("stop"), reason: z.string() }),
]);
export type Directive = z.infer<typeof DirectiveSchema>;

export const DirectiveReplySchema = z.strictObject({
  ...envelope("worker.directive"),
  directive: DirectiveSchema,
});
export type DirectiveReply = z.infer<typeof DirectiveReplySchema>;

export const FinishedSchema = z.strictObject({ ...envelope("job.finished"), job: JobIdSchema });
export type Finished = z.infer<typeof FinishedSchema>;
