import { z } from "zod";
import { envelope, HostSchema, JobIdSchema, PROTOCOL_VERSION } from "./envelope.ts";
import { ReplacementNameSchema } from "./replacement.ts";
import { idSchema, intSchema, isId, isInt, MAX_GPUS_PER_HOST, MAX_HOSTS, MAX_LIST_LENGTH, MAX_ADDRESS_LENGTH, textSchema } from "./limits.ts";

/** Worker ↔ controller: launchers register their worker and meet the controller at every barrier. */

const whole = (what: string) => intSchema(what, 0);
const positive = (what: string, max?: number) => intSchema(what, 1, max);

/** Which worker a message is about: one host's share of one group (pipeline stage) of a job. */
export const WorkerIdentitySchema = z.strictObject({
  job: JobIdSchema,
  /** Pipeline stage, 0 ≤ group < parallelism.pp. */
  group: intSchema("group", 0, MAX_HOSTS - 1),
  host: HostSchema,
});
export type WorkerIdentity = z.infer<typeof WorkerIdentitySchema>;

/**
 * How the job is split. `tp` ranks of a tensor-parallel group stay inside one host; `pp` is
 * the number of pipeline stages (groups); `dp` is the number of hosts in each stage, the DP
 * replicas that all-reduce together. The job has `pp × dp` workers. `tp` is bounded by the GPUs
 * a host can have and `pp`, `dp` by the hosts a cluster can have, so that routing a job's
 * flows (`tp` rings per DP group) stays bounded whatever a client sends.
 */
export const ParallelismSchema = z.strictObject({
  tp: positive("parallelism.tp", MAX_GPUS_PER_HOST),
  pp: positive("parallelism.pp", MAX_HOSTS),
  dp: positive("parallelism.dp", MAX_HOSTS),
});
export type Parallelism = z.infer<typeof ParallelismSchema>;

export const RegisterSchema = z.strictObject({
  ...envelope("worker.register"),
  worker: WorkerIdentitySchema,
  parallelism: ParallelismSchema,
  /** DP rings crossing a rack boundary per fragmented rack; defaults to `parallelism.tp`. */
  rings: positive("rings", MAX_GPUS_PER_HOST).optional(),
  /** Size of this worker's checkpoint: what a destination must stage to receive it. */
  checkpointBytes: whole("checkpointBytes"),
  /** Set by a replacement launcher a daemon spawned for a migration: the migration's single-use token. */
  token: idSchema("token").optional(),
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
  step: whole("step"),
  /** Generation of the assignment the worker runs with; an older one gets `reconfigure`. */
  generation: whole("generation"),
});
export type Barrier = z.infer<typeof BarrierSchema>;

/**
 * Whether `value` (a parsed frame) is a barrier `BarrierSchema` accepts, checked without zod:
 * every worker sends one per step, so barriers are most of what a controller reads, and this
 * takes a fraction of the schema's time. It accepts only what the schema accepts (exactly its
 * fields, the same bounds; test/sdk/protocol.test.ts holds the two side by side); anything it
 * refuses still goes through the schema, which names the problem.
 */
export function isPlainBarrier(value: unknown): value is Barrier {
  if (!hasKeys(value, 6)) return false;
  const { v, type, id, worker, step, generation } = value as Record<string, unknown>;
  if (v !== PROTOCOL_VERSION || type !== "worker.barrier" || !isInt(id, 0) || !isInt(step, 0) || !isInt(generation, 0) || !hasKeys(worker, 3)) return false;
  const { job, group, host } = worker as Record<string, unknown>;
  return isId(job) && isInt(group, 0, MAX_HOSTS - 1) && isInt(host, 0, MAX_HOSTS - 1);
}

/** Whether `value` is an object with exactly `count` own keys (a strict schema's fields, when each is then checked). */
function hasKeys(value: unknown, count: number): boolean {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return false;
  let keys = 0;
  for (const key in value) if (Object.hasOwn(value, key)) keys++;
  return keys === count;
}

/**
 * A launcher says it lives, answered `ack`. It beats on a timer of its own, whatever its
 * training does meanwhile (a long step, a model load, a checkpoint on its way), so that a
 * worker that beat and then fell silent past the controller's worker heartbeat timeout is
 * known to be lost, and a job whose every worker is lost can end.
 */
export const WorkerHeartbeatSchema = z.strictObject({
  ...envelope("worker.heartbeat"),
  worker: WorkerIdentitySchema,
});
export type WorkerHeartbeat = z.infer<typeof WorkerHeartbeatSchema>;

/** A launcher reports that its job ended; its hosts become free. */
export const FinishSchema = z.strictObject({
  ...envelope("job.finish"),
  job: JobIdSchema,
});
export type Finish = z.infer<typeof FinishSchema>;

/** Where a worker sits in its job: its torchrun node rank and the ring order it follows. */
export const AssignmentSchema = z.strictObject({
  job: JobIdSchema,
  group: whole("group"),
  host: HostSchema,
  /** `group × dp + position in the group's ring order`. */
  nodeRank: whole("nodeRank"),
  /** Workers in the job (`pp × dp`). */
  nodes: positive("nodes"),
  /** Host of node rank 0, where the job's rendezvous store runs. */
  masterHost: HostSchema,
  /** The master host's network address, as its daemon advertises it; null when it runs no daemon. */
  masterAddress: textSchema("masterAddress", MAX_ADDRESS_LENGTH).nullable(),
  /** Host order of this worker's DP ring(s). */
  ringOrder: z.array(HostSchema).max(MAX_LIST_LENGTH),
  /** Increases every time the job's membership or order changes. */
  generation: whole("generation"),
  /** The barrier step the job resumes after; null at a fresh start. */
  resumeStep: whole("resumeStep").nullable(),
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
    migration: idSchema("migration"),
    to: HostSchema,
    endpoint: textSchema("endpoint", MAX_ADDRESS_LENGTH),
    token: idSchema("token"),
    step: whole("step"),
  }),
  /** Exit: this worker's place is taken by its replacement, or the job ended. */
  z.strictObject({ kind: z.literal("stop"), reason: textSchema("reason") }),
]);
export type Directive = z.infer<typeof DirectiveSchema>;

export const DirectiveReplySchema = z.strictObject({
  ...envelope("worker.directive"),
  directive: DirectiveSchema,
});
export type DirectiveReply = z.infer<typeof DirectiveReplySchema>;

/**
 * Whether `value` (a parsed frame) is the answer to nearly every barrier, `continue`, as
 * `DirectiveReplySchema` accepts it, checked without zod: a client reads one per worker per
 * step. Like `isPlainBarrier` it accepts only what the schema accepts; other directives, and
 * anything it refuses, go through the schema.
 */
export function isPlainContinue(value: unknown): value is DirectiveReply {
  if (!hasKeys(value, 4)) return false;
  const { v, type, id, directive } = value as Record<string, unknown>;
  return v === PROTOCOL_VERSION && type === "worker.directive" && isInt(id, 0) && hasKeys(directive, 1) && (directive as Record<string, unknown>).kind === "continue";
}

export const FinishedSchema = z.strictObject({ ...envelope("job.finished"), job: JobIdSchema });
export type Finished = z.infer<typeof FinishedSchema>;
