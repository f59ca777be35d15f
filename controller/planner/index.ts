/**
 * `monkeytree/planner`: the planner and Perfect routing as a library. Pure computation on a
 * validated snapshot; no controller, no I/O.
 */
export { parseSnapshot, type Cluster, type Group, type Placement } from "./model/cluster.ts";
export type { Snapshot, SnapshotInput, Topology } from "./model/snapshot.ts";
export { InvalidInputError, type InputIssue } from "../../sdk/contract/errors.ts";
export {
  createPlanner,
  DEFAULT_TIME_LIMIT_MS,
  PlanTimeoutError,
  type BestEffort,
  type Formulation,
  type Move,
  type Plan,
  type Planner,
  type PlanOptions,
  type PlanProgress,
  type PlanStatus,
} from "./plan/index.ts";
export { routeCluster, type RouteOptions } from "./route/index.ts";
export type { DpRoute, PpRoute, Routes } from "./route/schema.ts";
