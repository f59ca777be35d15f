import { z } from "zod";
import { envelope, HostSchema, JobIdSchema } from "./envelope.ts";
import { idSchema, intSchema, MAX_LIST_LENGTH, textSchema } from "./limits.ts";

/**
 * The controller's decisions, one event each: a job seen, fragmentation found, a plan, every
 * state a move enters, a rollback and why, a failure after commit, a worker or a daemon lost. The
 * controller writes each as one JSON line beside its journal (`events.jsonl`) and serves the
 * latest to `monkeytree status --follow` through the `events` request. Unlike the journal
 * they are a record for people: nothing replays them.
 */

const count = z.int().min(0);
const list = <T extends z.ZodType>(item: T) => z.array(item).max(MAX_LIST_LENGTH);
const MigrationIdSchema = idSchema("migration id");

/** The planner's verdicts (`controller/plan`): see docs/planner.md. */
export const PLAN_STATUSES = ["unchanged", "optimal", "feasible", "infeasible"] as const;

/** Every event carries its number in the log (from 1, never reused) and the controller's time (ms since the epoch). */
const base = { seq: intSchema("seq", 1), at: z.number() };

export const ControllerEventSchema = z.discriminatedUnion("event", [
  /** Every worker of a job registered: the cluster's scheduler placed it. */
  z.strictObject({ ...base, event: z.literal("job-started"), job: JobIdSchema, hosts: list(HostSchema), rings: count }),
  z.strictObject({ ...base, event: z.literal("job-finished"), job: JobIdSchema }),
  /** Some rack went over its bound: its fragmentation degree (rings) against `lambda`, per rack. */
  z.strictObject({ ...base, event: z.literal("fragmentation"), racks: list(count), lambda: count, over: list(count) }),
  /** The planner's answer to it; `plan` names the moves' plan, null when there are none. */
  z.strictObject({
    ...base,
    event: z.literal("plan"),
    plan: idSchema("plan id").nullable(),
    status: z.enum(PLAN_STATUSES),
    moves: count,
    steps: count,
    seconds: z.number().min(0),
  }),
  z.strictObject({ ...base, event: z.literal("plan-failed"), reason: textSchema("reason") }),
  /** A move entered state `to` from `from` (`controller/service/migration.ts`). */
  z.strictObject({
    ...base,
    event: z.literal("move"),
    migration: MigrationIdSchema,
    job: JobIdSchema,
    source: HostSchema,
    destination: HostSchema,
    from: textSchema("from", 32),
    to: textSchema("to", 32),
  }),
  z.strictObject({ ...base, event: z.literal("rollback"), migration: MigrationIdSchema, job: JobIdSchema, reason: textSchema("reason") }),
  /** A move failed after it committed: it stands, and an operator must look at it. */
  z.strictObject({ ...base, event: z.literal("alert"), migration: MigrationIdSchema, job: JobIdSchema, reason: textSchema("reason") }),
  z.strictObject({ ...base, event: z.literal("daemon-lost"), host: HostSchema, silentMs: z.number().min(0) }),
  /** A worker's launcher heartbeated, then fell silent for the controller's worker heartbeat timeout. */
  z.strictObject({ ...base, event: z.literal("worker-lost"), job: JobIdSchema, host: HostSchema, silentMs: z.number().min(0) }),
]);
export type ControllerEvent = z.infer<typeof ControllerEventSchema>;
/** An event before the log numbers and stamps it. */
export type ControllerEventBody = ControllerEvent extends infer E ? (E extends ControllerEvent ? Omit<E, "seq" | "at"> : never) : never;

/** Events one `events` reply carries at most; a follower asks again for the rest. */
export const MAX_EVENTS_PER_REPLY = 256;

/**
 * An operator asks for the events after `after` (a `seq`); without it, for the latest few, as
 * `tail` starts. Operator credential only, as for `status`.
 */
export const EventsRequestSchema = z.strictObject({ ...envelope("events"), after: count.optional() });
export type EventsRequest = z.infer<typeof EventsRequestSchema>;

export const EventsReplySchema = z.strictObject({
  ...envelope("events.batch"),
  events: z.array(ControllerEventSchema).max(MAX_EVENTS_PER_REPLY),
  /** The newest event's `seq` (0 before the first): ask after it next. */
  last: count,
  /** Events after `after` the controller no longer holds in memory (the file keeps them). */
  missed: count,
});
export type EventsReply = z.infer<typeof EventsReplySchema>;
