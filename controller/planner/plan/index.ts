export { createPlanner, DEFAULT_TIME_LIMIT_MS, MAX_PROGRAM_CELLS, PlanTimeoutError } from "./planner.ts";
export type { Formulation, Plan, PlanBudget, PlanOptions, PlanProgress, Planner } from "./planner.ts";
export { applyMoves, PlanError } from "./check.ts";
export type { BestEffort, Move, PlanStatus } from "./schema.ts";
