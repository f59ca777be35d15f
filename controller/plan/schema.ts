import { z } from "zod";

/** The JSON document `monkeytree plan --json` prints; consumers parse it with this schema. */
export const MoveSchema = z.strictObject({
  job: z.string(),
  group: z.int().min(0),
  from: z.int().min(0),
  to: z.int().min(0),
  step: z.int().min(0),
});

const Degrees = z.strictObject({ before: z.array(z.int().min(0)), after: z.array(z.int().min(0)) });

export const PlanDocumentSchema = z.strictObject({
  status: z.enum(["unchanged", "optimal", "feasible", "infeasible"]),
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
