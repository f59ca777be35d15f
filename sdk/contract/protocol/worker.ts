import { z } from "zod";
import { envelope, HostSchema, JobIdSchema } from "./envelope.ts";
import { ReplacementNameSchema } from "./replacement.ts";
import { idSchema, intSchema, MAX_GPUS_PER_HOST, MAX_HOSTS, MAX_LIST_LENGTH, MAX_ADDRESS_LENGTH, textSchema } from "./limits.ts";

/** Worker ↔ controller: launchers register their worker, report its progress and take orders. */

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

/**
 * Where a host stands in a stop it was told of (see "The stop-point agreement" in sdk/contract/protocol/README.md):
 * `armed`, training on toward `step`; `held`, every local process waits at barrier `step`;
 * `saving`, the source writes and sends its checkpoint; `saved`, it went out; `sealed`, the
 * host agreed to the commit and waits for its outcome, however long; `released`, the host let
 * go of the stop by itself after its hold timeout without word from the controller.
 */
export const HOLD_PHASES = ["armed", "held", "saving", "saved", "sealed", "released"] as const;
export type HoldPhase = (typeof HOLD_PHASES)[number];

export const HoldSchema = z.strictObject({
  stop: idSchema("hold.stop"),
  step: whole("hold.step"),
  phase: z.enum(HOLD_PHASES, { error: `hold.phase must be one of ${HOLD_PHASES.join(", ")}` }),
});
export type Hold = z.infer<typeof HoldSchema>;

/** The longest step time a report may carry: a day. */
const MAX_STEP_MS = 86_400_000;

/**
 * A launcher's progress and hold state, sent on a timer of its own (whatever the training does)
 * and at once when its hold changes; never on a training step's path. Answered with the
 * worker's current `worker.order`. A worker that reported and then fell silent past the
 * controller's worker heartbeat timeout is lost.
 */
export const ReportSchema = z.strictObject({
  ...envelope("worker.report"),
  worker: WorkerIdentitySchema,
  /** Generation of the assignment the worker runs with. */
  generation: whole("generation"),
  /** The last barrier any of the host's processes reached; null before the first. */
  step: whole("step").nullable(),
  /** The median of the host's recent step times; null until it has one. */
  stepMs: z
    .number({ error: "stepMs must be a number of milliseconds" })
    .min(0, { error: "stepMs must not be negative" })
    .max(MAX_STEP_MS, { error: `stepMs must be at most ${MAX_STEP_MS}` })
    .nullable(),
  hold: HoldSchema.nullable(),
});
export type Report = z.infer<typeof ReportSchema>;

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

/** What a training process is told at a barrier, decided on its own host (`sdk/client/hold.ts`). */
export const DirectiveSchema = z.discriminatedUnion("kind", [
  /** Keep training. */
  z.strictObject({ kind: z.literal("continue") }),
  /** Re-form the process group with a new rank, world size, master or ring order, then continue. */
  z.strictObject({ kind: z.literal("reconfigure"), assignment: AssignmentSchema }),
  /**
   * Checkpoint into the destination's staging buffer, then call `barrier` again with the same
   * step: it answers `stop` once the move commits, `continue` if it rolled back.
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

/**
 * What the controller wants of one worker now; the answer to every `worker.report`, and pushed
 * (with id 0, which no request uses) whenever it changes. Every order is the whole current
 * truth, so a lost or repeated one does no harm: the next report's answer repeats it.
 */
export const OrderSchema = z.discriminatedUnion("kind", [
  /** No stop concerns the worker: train on, and let go of any stop held (a rollback). */
  z.strictObject({ kind: z.literal("run") }),
  /** Hold every local process at barrier `step` (or at the first barrier none has passed, if later). */
  z.strictObject({ kind: z.literal("stop-at"), stop: idSchema("stop"), step: whole("step") }),
  /** The held source checkpoints into the destination's staging. */
  z.strictObject({
    kind: z.literal("migrate-out"),
    stop: idSchema("stop"),
    migration: idSchema("migration"),
    to: HostSchema,
    endpoint: textSchema("endpoint", MAX_ADDRESS_LENGTH),
    token: idSchema("token"),
    step: whole("step"),
  }),
  /** Agree to the commit: from now on only the controller may end the hold. */
  z.strictObject({ kind: z.literal("seal"), stop: idSchema("stop") }),
  /** Re-form the process group with this assignment, then train on. */
  z.strictObject({ kind: z.literal("reconfigure"), assignment: AssignmentSchema }),
  /** Exit: a replacement carries the worker on, or the job ended. */
  z.strictObject({ kind: z.literal("stop"), reason: textSchema("reason") }),
]);
export type Order = z.infer<typeof OrderSchema>;

export const OrderMessageSchema = z.strictObject({
  ...envelope("worker.order"),
  worker: WorkerIdentitySchema,
  order: OrderSchema,
});
export type OrderMessage = z.infer<typeof OrderMessageSchema>;

export const FinishedSchema = z.strictObject({ ...envelope("job.finished"), job: JobIdSchema });
export type Finished = z.infer<typeof FinishedSchema>;
