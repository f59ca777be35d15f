import * as highsModule from "highs";
import type { Highs, InitOptions } from "highs";
import type { Cluster, Placement } from "../model/cluster.ts";
import { podFragmentation, rackFragmentation, withinBounds } from "../model/fragmentation.ts";
import { applyMoves, PlanError } from "./check.ts";
import { CountState, moveDistance, type Counts } from "./counts.ts";
import { monkeytreeProgram, paperProgram } from "./ilp.ts";
import { solveMip } from "./mip.ts";
import { hostMoves } from "./moves.ts";
import type { Move, PlanDocument, PlanStatus } from "./schema.ts";
import { searchMoves, type RackMove } from "./search.ts";

export type Formulation = "monkeytree" | "paper";

export interface PlanOptions {
  /** Wall-clock budget; past it the best valid plan found is returned as `feasible`. */
  readonly timeLimitMs?: number;
  /** "paper" solves the published program (fragmented groups only) for comparison. */
  readonly formulation?: Formulation;
  /** Told what the planner has established so far, between phases of a long plan. */
  readonly onProgress?: (progress: PlanProgress) => void;
  /** Work caps that make the path a plan takes the same on every machine; see `PlanBudget`. */
  readonly budget?: PlanBudget;
}

/**
 * The time limit alone makes which phase finds the plan (and so the plan, when several are
 * minimal) depend on the machine's speed. Each cap ends a phase as if its share of the time
 * had run out, whatever the clock says: for tests that must take one path on a slow loaded
 * machine and a fast one alike, and to replay an event exactly. The time limit still applies.
 */
export interface PlanBudget {
  /** Nodes each pass of the exact search may visit; 0 skips it. */
  readonly exactNodes?: number;
  /** Nodes each dive may visit; 0 skips the dives. */
  readonly diveNodes?: number;
  /** Branch-and-bound nodes HiGHS may open; 0 stops it after the root. */
  readonly mipNodes?: number;
}

export interface PlanProgress {
  readonly phase: "search" | "dive" | "ilp";
  /** Proven lower bound on the number of moves so far. */
  readonly lowerBound: number;
  /** Moves of the best valid plan so far, if any. */
  readonly best?: number;
  readonly elapsedMs: number;
}

export const DEFAULT_TIME_LIMIT_MS = 5_000;

export interface Plan {
  /**
   * `unchanged`: already within bounds. `optimal`: no plan with fewer moves exists.
   * `feasible`: valid, but the budget ran out before it was proved optimal.
   * `infeasible`: no placement at all meets the bounds (for "paper": none that moves only
   * fragmented groups).
   */
  readonly status: PlanStatus;
  readonly moves: readonly Move[];
  readonly moveCount: number;
  readonly steps: number;
  /** Proven lower bound on the number of moves. */
  readonly lowerBound: number;
  /** How the plan was found: exact neighbourhood search, or the ILP. */
  readonly method: PlanDocument["method"];
  readonly fragmentation: { readonly before: readonly number[]; readonly after: readonly number[] };
  readonly podFragmentation?: { readonly before: readonly number[]; readonly after: readonly number[] };
  readonly placement: Placement;
  readonly solveMs: number;
  /** Why no placement can meet the bounds, when a simple rule shows it (status `infeasible`). */
  readonly reason?: string;
}

/**
 * No valid plan was found before the time limit (or a cap of `PlanOptions.budget`), and
 * infeasibility was not proven either.
 */
export class PlanTimeoutError extends Error {
  override readonly name = "PlanTimeoutError";
  readonly code = "plan_timeout";
  constructor(readonly timeLimitMs: number, readonly lowerBound: number, budgeted = false) {
    super(
      `no plan found within ${timeLimitMs / 1000} s${budgeted ? " and the work budget" : ""} ` +
        `(at least ${lowerBound} moves are needed); raise ${budgeted ? "the budget or " : ""}--time-limit`,
    );
  }
}

/**
 * How the budget is spent when the exact search does not prove a plan at once, as shares of
 * the time limit reached by each phase: a first exact pass; a narrow dive for a valid plan;
 * the exact search again, bounded by that plan; wider dives for shorter plans; HiGHS for the
 * rest.
 */
const FIRST_EXACT_SHARE = 0.15;
const EXACT_SHARE = 0.6;
const DIVE_SHARE = 0.75;
/** Deeper than this the search's branching outgrows the ILP. */
const SEARCH_DEPTH = 12;
/** Longest plan a dive looks for, and its beam widths, narrowest (fastest) first. */
const DIVE_DEPTH = 40;
const DIVE_BEAMS = [2, 3, 4] as const;

export interface Planner {
  /** Plans the fewest worker moves that bring every rack (and pod) within its bound. */
  plan(cluster: Cluster, options?: PlanOptions): Plan;
}

/**
 * The package ships CommonJS typings for an ES module build, so TypeScript sees the module
 * namespace where Node hands us the loader function.
 */
const loadHighs = (highsModule as unknown as { default: (options?: InitOptions) => Promise<Highs> }).default;

/** Loads HiGHS once; planning itself is synchronous. */
export async function createPlanner(): Promise<Planner> {
  const highs = await loadHighs();
  return { plan: (cluster, options) => plan(highs, cluster, options) };
}

function plan(highs: Highs, cluster: Cluster, options: PlanOptions = {}): Plan {
  const start = performance.now();
  const timeLimitMs = options.timeLimitMs ?? DEFAULT_TIME_LIMIT_MS;
  const deadline = start + timeLimitMs;
  const state = new CountState(cluster);
  const finish = (status: PlanStatus, method: Plan["method"], target: Counts, lowerBound: number) =>
    result(cluster, status, method, target, lowerBound, start);

  if (state.valid) return finish("unchanged", "none", state.count, 0);
  const reason = obviouslyInfeasible(cluster);
  if (reason) return { ...finish("infeasible", "none", state.count, 0), reason };

  const { exactNodes, diveNodes, mipNodes } = options.budget ?? {};
  const capped = (nodes: number | undefined) => (nodes === undefined ? {} : { nodeLimit: nodes });
  let lowerBound = 1;
  let incumbent: Counts | undefined;
  const report = (phase: PlanProgress["phase"], best?: number) =>
    options.onProgress?.({ phase, lowerBound, ...(best === undefined || !Number.isFinite(best) ? {} : { best }), elapsedMs: performance.now() - start });
  if (options.formulation !== "paper") {
    const at = (share: number) => start + timeLimitMs * share;
    const fresh = () => new CountState(cluster);
    // Most events are proved in milliseconds by the exact search alone.
    let exact = searchMoves(fresh(), SEARCH_DEPTH, at(FIRST_EXACT_SHARE), capped(exactNodes));
    if (exact.kind === "found") return finish("optimal", "search", applyRackMoves(state, exact.moves), exact.moves.length);
    lowerBound = exact.depth + 1;
    report("search");
    // A quick plan first, then the exact search again, now only up to one move short of it:
    // exhausting that proves the plan minimal. Wider dives then look for shorter plans.
    let best = Number.POSITIVE_INFINITY;
    const dive = (beam: number, until: number) => {
      if (best <= lowerBound) return;
      const outcome = searchMoves(fresh(), Math.min(DIVE_DEPTH, best - 1), at(until), { firstDepth: lowerBound, beam, ...capped(diveNodes) });
      if (outcome.kind !== "found") return;
      incumbent = applyRackMoves(state, outcome.moves);
      best = outcome.moves.length;
      report("dive", best);
    };
    dive(DIVE_BEAMS[0], EXACT_SHARE);
    if (best > lowerBound) {
      exact = searchMoves(fresh(), Math.min(SEARCH_DEPTH, best - 1), at(EXACT_SHARE), { firstDepth: lowerBound, ...capped(exactNodes) });
      if (exact.kind === "found") return finish("optimal", "search", applyRackMoves(state, exact.moves), exact.moves.length);
      if (exact.kind === "exhausted" && best - 1 <= SEARCH_DEPTH && incumbent) return finish("optimal", "search", incumbent, best);
      lowerBound = Math.max(lowerBound, exact.depth + 1);
      report("search", best);
    }
    for (const beam of DIVE_BEAMS.slice(1)) dive(beam, DIVE_SHARE);
    if (incumbent && best <= lowerBound) return finish("optimal", "search", incumbent, best);
  }

  report("ilp", incumbent ? moveDistance(state.count, incumbent) : undefined);
  const program = options.formulation === "paper" ? paperProgram(state) : monkeytreeProgram(state, lowerBound);
  const solved = solveMip(highs, program.model, {
    timeLimitSec: ilpSeconds(deadline - performance.now()),
    ...(incumbent ? { start: program.encode(incumbent) } : {}),
    ...(mipNodes === undefined ? {} : { maxNodes: mipNodes }),
  });
  // A plan the search found is verified; it outranks any numerical claim of infeasibility.
  if (solved.status === "infeasible" && !incumbent) return finish("infeasible", "ilp", state.count, lowerBound);
  const found = solved.values ? program.decode(solved.values) : incumbent;
  if (!found) throw new PlanTimeoutError(timeLimitMs, lowerBound, options.budget !== undefined);
  lowerBound = Math.max(lowerBound, Math.ceil(solved.bound * program.movesPerObjective - 1e-6));
  const target = incumbent && moveDistance(state.count, incumbent) < moveDistance(state.count, found) ? incumbent : found;
  const moves = moveDistance(state.count, target);
  const proven = solved.status === "optimal" || moves <= lowerBound;
  return finish(proven ? "optimal" : "feasible", "ilp", target, Math.min(lowerBound, moves));
}

/**
 * A group too large for one rack (or pod) spans several whatever the plan, adding its rings to
 * each of them; when its rings alone exceed the bound, no placement exists. Saying so at once,
 * with the culprit, beats letting a search prove it exhaustively.
 */
function obviouslyInfeasible(cluster: Cluster): string | undefined {
  const { hostsPerRack, racksPerPod } = cluster.topology;
  for (const [g, group] of cluster.groups.entries()) {
    const size = cluster.placement[g]?.length ?? 0;
    const name = `job "${group.job}"${group.index > 0 ? ` group ${group.index}` : ""}`;
    if (size > hostsPerRack && group.rings > cluster.lambda) {
      return `${name} has ${size} hosts, more than a rack's ${hostsPerRack}, so it spans racks and adds its ${group.rings} rings to each, above λ = ${cluster.lambda}`;
    }
    const podHosts = hostsPerRack * (racksPerPod ?? 0);
    if (cluster.podLambda !== undefined && size > podHosts && group.rings > cluster.podLambda) {
      return `${name} has ${size} hosts, more than a pod's ${podHosts}, so it spans pods and adds its ${group.rings} rings to each, above pod λ = ${cluster.podLambda}`;
    }
  }
  return undefined;
}

/**
 * HiGHS checks its clock only once presolve is done, and loading plus presolving a large
 * model takes a few hundred milliseconds, so it gets part of what is left.
 */
function ilpSeconds(remainingMs: number): number {
  return Math.max(0.05, remainingMs * 0.7 - 100) / 1000;
}

function applyRackMoves(state: CountState, moves: readonly RackMove[]): Counts {
  const counts = Int32Array.from(state.count);
  for (const m of moves) {
    counts[m.group * state.racks + m.from]! -= 1;
    counts[m.group * state.racks + m.to]! += 1;
  }
  return counts;
}

/** Builds the plan and checks it end to end: a wrong plan is a bug, never an answer. */
function result(cluster: Cluster, status: PlanStatus, method: Plan["method"], target: Counts, lowerBound: number, start: number): Plan {
  const moves = hostMoves(cluster, target);
  const after = status === "infeasible" ? cluster.placement : applyMoves(cluster, moves);
  if (status !== "infeasible" && !withinBounds(cluster, after)) {
    throw new PlanError("internal: the plan leaves a rack or pod over its bound");
  }
  const podBefore = podFragmentation(cluster);
  const shown = status === "infeasible" ? [] : moves;
  return {
    status,
    moves: shown,
    moveCount: shown.length,
    steps: new Set(shown.map((m) => m.step)).size,
    lowerBound,
    method,
    fragmentation: { before: rackFragmentation(cluster), after: rackFragmentation(cluster, after) },
    ...(cluster.podCount > 0 ? { podFragmentation: { before: podBefore, after: podFragmentation(cluster, after) } } : {}),
    placement: after,
    solveMs: performance.now() - start,
  };
}

