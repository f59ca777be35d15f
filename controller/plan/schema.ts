import { z } from "zod";
import { PLAN_STATUSES } from "../../sdk/protocol/events.ts";

/** One worker's migration, as in the plan contract of the design page. */
export const MoveSchema = z.strictObject({
  job: z.string(),
  /** Index in the job's `groups`; 0 for a job given as `hosts`. */
  group: z.int().min(0),
  from: z.int().min(0),
  to: z.int().min(0),
  /** Moves run in increasing step; see `PlanError` for what a step guarantees. */
  step: z.int().min(0),
});
export type Move = Readonly<z.infer<typeof MoveSchema>>;

const Degrees = z.strictObject({ before: z.array(z.int().min(0)), after: z.array(z.int().min(0)) });

/** The JSON document `monkeytree plan --json` prints; consumers parse it with this schema. */
export const PlanDocumentSchema = z.strictObject({
  status: z.enum(PLAN_STATUSES),
  moves: z.array(MoveSchema),
  moveCount: z.int().min(0),
  steps: z.int().min(0),
  lowerBound: z.int().min(0),
  method: z.enum(["none", "search", "ilp"]),
  lambda: z.int().min(0),
  /** Why no placement exists, when a simple rule shows it. */
  reason: z.string().optional(),
  podLambda: z.int().min(0).optional(),
  fragmentation: Degrees,
  podFragmentation: Degrees.optional(),
  solveMs: z.number().min(0),
});
export type PlanDocument = z.infer<typeof PlanDocumentSchema>;
export type PlanStatus = PlanDocument["status"];
