import { z } from "zod";
import { PLAN_STATUSES } from "../../../sdk/contract/protocol/events.ts";

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

/** A rack or pod the plan leaves over λ, and why. */
const Residual = z.strictObject({
  index: z.int().min(0),
  /**
   * `pinned`: pinned jobs alone fragment it past λ. `no-room`: no placement meets every bound
   * with the hosts a plan may use (unavailable hosts and pinned jobs take the rest).
   */
  cause: z.enum(["pinned", "no-room"]),
  /** Degree the pinned jobs alone give it: the lowest any plan can reach. */
  pinned: z.int().min(0),
  /** Its degree after the plan. */
  after: z.int().min(0),
});

/**
 * Present when some rack (or pod) cannot be brought within λ. Pinned jobs alone fragment it
 * past λ: the plan holds each such domain to its pinned floor (every movable fragmented group
 * off it) and every other domain to λ, with the fewest moves. Or no placement meets the bounds
 * on the hosts a plan may use: the plan leaves the least fragmentation over the bounds, summed
 * over racks, with the fewest moves for that.
 */
export const BestEffortSchema = z.strictObject({ racks: z.array(Residual), pods: z.array(Residual) });
export type BestEffort = z.infer<typeof BestEffortSchema>;

/** The JSON document `monkeytree plan --json` prints; consumers parse it with this schema. */
export const PlanDocumentSchema = z.strictObject({
  status: z.enum(PLAN_STATUSES),
  moves: z.array(MoveSchema),
  moveCount: z.int().min(0),
  steps: z.int().min(0),
  lowerBound: z.int().min(0),
  method: z.enum(["none", "search", "repair", "ilp"]),
  lambda: z.int().min(0),
  /** Why no placement exists, when a simple rule shows it. */
  reason: z.string().optional(),
  podLambda: z.int().min(0).optional(),
  fragmentation: Degrees,
  podFragmentation: Degrees.optional(),
  bestEffort: BestEffortSchema.optional(),
  solveMs: z.number().min(0),
});
export type PlanDocument = z.infer<typeof PlanDocumentSchema>;
export type PlanStatus = PlanDocument["status"];
