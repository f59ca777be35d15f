// When a `simulateSystem` run of a MonkeyTree system calls the planner, as the controller does:
// after an event that changed the placement, if the cluster is over its bound and no migration
// is in flight; with `planTime: solve`, the plan arrives later and may have gone stale.
import { withinBounds } from "../planner/model/fragmentation.ts";
import type { PlanEvent } from "./simulate.ts";
import { migrate } from "./simulate-migration.ts";
import { reroute } from "./simulate-network.ts";
import { isDue, type SimState } from "./simulate-state.ts";

/** A plan's status when the cluster changed while it was computed, and nothing moved. */
export const STALE_PLAN = "stale";

/**
 * After an event's changes: a plan computed in simulated time that is due arrives; otherwise,
 * if the placement changed, the cluster is planned when it needs it.
 */
export function planAfterEvent(state: SimState, placementChanged: boolean): void {
  if (placementChanged) state.placements++;
  if (state.computing && isDue(state, state.computing.ready)) planArrived(state);
  else if (placementChanged) maybePlan(state);
}

/** Plans, and migrates, if the system migrates, no plan is in flight or being computed, and the cluster is over its bound. */
export function maybePlan(state: SimState): void {
  const { planner, config, now } = state;
  if (!state.spec.migrate || !planner || state.migrations.length > 0 || state.computing) return;
  if (state.routesDirty) reroute(state);
  if (withinBounds(state.cluster)) return;
  let plan;
  try {
    plan = planner.plan(state.cluster, { timeLimitMs: config.planTimeLimitMs, budget: config.planBudget });
  } catch (error) {
    return planned(state, { time: now, status: error instanceof Error ? error.name : "error", moves: 0, solveMs: 0 });
  }
  if (config.planTime === "solve" && plan.moves.length > 0) {
    state.computing = { plan, time: now, ready: now + Math.min(plan.solveMs, config.planTimeLimitMs) / 1000, placement: state.placements };
    return;
  }
  planned(state, { time: now, status: plan.status, moves: plan.moveCount, solveMs: plan.solveMs });
  migrate(state, plan);
}

/** The plan computed in simulated time arrives: carried out, or discarded if the cluster changed meanwhile. */
export function planArrived(state: SimState): void {
  const { plan, time, placement } = state.computing!;
  state.computing = undefined;
  const stale = placement !== state.placements;
  planned(state, { time, status: stale ? STALE_PLAN : plan.status, moves: stale ? 0 : plan.moveCount, solveMs: plan.solveMs });
  if (stale) maybePlan(state);
  else migrate(state, plan);
}

function planned(state: SimState, event: PlanEvent): void {
  state.plans.push(event);
  state.observer.planned?.(event);
}
