import * as highsModule from "highs";
import type { Highs, InitOptions } from "highs";
import type { Cluster, Placement } from "../model/cluster.ts";
import { plannedBounds, podFragmentation, rackFragmentation, withinBounds, type Bounds } from "../model/fragmentation.ts";
import { InvalidInputError } from "../../../sdk/contract/errors.ts";
import { applyMoves, PlanError } from "./check.ts";
import { CountState, moveDistance, type Counts } from "./counts.ts";
import { monkeytreeProgram, paperProgram } from "./ilp.ts";
import { solveMip } from "./mip.ts";
import { hostMoves } from "./moves.ts";
import { repair } from "./repair.ts";
import type { BestEffort, Move, PlanDocument, PlanStatus } from "./schema.ts";
import { Search, searchMoves, type RackMove } from "./search.ts";

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
  /** Nodes the exact search may visit in all; 0 skips it. */
  readonly exactNodes?: number;
  /** Nodes each dive may visit; 0 skips the dives. */
  readonly diveNodes?: number;
  /** Branch-and-bound nodes HiGHS may open; 0 stops it after the root. */
  readonly mipNodes?: number;
  /** Steps the quick repair may take (`repair`); 0 skips it. */
  readonly repairSteps?: number;
}

export interface PlanProgress {
  readonly phase: "search" | "repair" | "dive" | "ilp";
  /** Proven lower bound on the number of moves so far. */
  readonly lowerBound: number;
  /** Moves of the best valid plan so far, if any. */
  readonly best?: number;
  readonly elapsedMs: number;
}

export const DEFAULT_TIME_LIMIT_MS = 5_000;

/**
 * (group, rack) cells past which no program goes to HiGHS: each cell is four or five columns
 * and three rows, and HiGHS's memory grows past a gigabyte beyond the worst snapshot of 2,048
 * hosts (1,024 two-host jobs over 256 racks). Larger events are planned by the search and the
 * repair alone.
 */
export const MAX_PROGRAM_CELLS = 1_024 * 256;

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
  /** How the plan was found: exact neighbourhood search, the ILP, or the repair alone. */
  readonly method: PlanDocument["method"];
  readonly fragmentation: { readonly before: readonly number[]; readonly after: readonly number[] };
  readonly podFragmentation?: { readonly before: readonly number[]; readonly after: readonly number[] };
  readonly placement: Placement;
  readonly solveMs: number;
  /** Why no placement can meet the bounds, when a simple rule shows it (status `infeasible`). */
  readonly reason?: string;
  /**
   * Racks and pods the plan cannot bring within λ, and why (see `BestEffortSchema`); absent
   * when there are none. The plan (and its status) is then for the bounds it could reach.
   */
  readonly bestEffort?: BestEffort;
}

/**
 * No valid plan was found before the time limit (or a cap of `PlanOptions.budget`), and
 * infeasibility was not proven either.
 */
export class PlanTimeoutError extends Error {
  override readonly name = "PlanTimeoutError";
  readonly code = "plan_timeout";
  constructor(
    readonly timeLimitMs: number,
    readonly lowerBound: number,
    budgeted = false,
  ) {
    super(
      `no plan found within ${timeLimitMs / 1000} s${budgeted ? " and the work budget" : ""} ` +
        `(at least ${lowerBound} moves are needed); raise ${budgeted ? "the budget or " : ""}--time-limit`,
    );
  }
}

/**
 * The anytime schedule, in times measured from the start and never as shares of the limit, so
 * that every limit runs the same phases in the same order and a limit only cuts the schedule
 * short: a limit at least as long as a longer one took to prove the optimum returns it. The
 * exact search runs first, for up to `FIRST_SLICE_MS` (most events are proved well inside it);
 * then dives look for a valid plan, narrowest beam first, each for at most `DIVE_SLICE_MS`;
 * then the exact search resumes where it paused (`Search`), bounded by the best plan, until
 * it proves one or the limit ends it. HiGHS gets the time left once the exact search can do no
 * more (past its depth, or its node budget spent), and a slice of its own (`ILP_SLICE_MS`)
 * before the dives when the repair fails.
 */
const FIRST_SLICE_MS = 500;
const DIVE_SLICE_MS = 500;
/**
 * Where a phase has a work cap (`PlanBudget`), its slices end by work instead, so that the path
 * does not depend on the machine's speed: the exact search's first slice after this many nodes
 * (about what 500 ms visits on one core of a 2-core development machine), each dive at its
 * node cap.
 */
const FIRST_SLICE_NODES = 150_000;
/** HiGHS's turn when the repair found nothing; with a node cap (`PlanBudget.mipNodes`) it ends by that instead. */
const ILP_SLICE_MS = 2_000;
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
  const bounds = plannedBounds(cluster);
  return planWithoutMoves(cluster, bounds, start) ?? new PlanRun(highs, cluster, bounds, options, start).run();
}

/**
 * The plans that move nothing. Checking a snapshot costs time and memory linear in its size;
 * the per (group, rack) structures of `PlanRun` are built only when something is over its bound.
 */
function planWithoutMoves(cluster: Cluster, bounds: Bounds, start: number): Plan | undefined {
  if (withinBounds(cluster, cluster.placement, bounds)) return unmoved(cluster, "unchanged", bounds, start);
  const reason = obviouslyInfeasible(cluster);
  return reason ? { ...unmoved(cluster, "infeasible", bounds, start), reason } : undefined;
}

/** Whether HiGHS is given the programs of this cluster (`MAX_PROGRAM_CELLS`). */
function programFits(cluster: Cluster): boolean {
  return cluster.groups.length * cluster.topology.racks <= MAX_PROGRAM_CELLS;
}

function checkPaperFits(cluster: Cluster): void {
  if (programFits(cluster)) return;
  const cells = `${cluster.groups.length} groups × ${cluster.topology.racks} racks`;
  throw new InvalidInputError("--formulation paper", [
    { path: "", message: `the program for ${cells} is larger than HiGHS is given (${MAX_PROGRAM_CELLS} cells); plan with --formulation monkeytree` },
  ]);
}

const nodeCap = (nodes: number | undefined) => (nodes === undefined ? {} : { nodeLimit: nodes });

/** One plan of a cluster over its bounds: the anytime schedule, and what it has established so far. */
class PlanRun {
  private readonly timeLimitMs: number;
  private readonly deadline: number;
  private readonly budget: PlanBudget;
  private readonly state: CountState;
  private readonly programFits: boolean;
  /** The published program, which HiGHS alone solves ("paper"). */
  private readonly program: ReturnType<typeof paperProgram> | undefined;
  private lowerBound = 1;
  private incumbent: Counts | undefined;
  private best = Number.POSITIVE_INFINITY;
  /**
   * The repair's plan, held aside: the searches look for the fewest moves as if it did not
   * exist, and it is the answer only where they end with nothing better.
   */
  private net: { readonly counts: Counts; readonly moves: number } | undefined;
  private ranIlp = false;
  private exactDone = false;

  constructor(
    private readonly highs: Highs,
    private readonly cluster: Cluster,
    private readonly bounds: Bounds,
    private readonly options: PlanOptions,
    private readonly start: number,
  ) {
    this.timeLimitMs = options.timeLimitMs ?? DEFAULT_TIME_LIMIT_MS;
    this.deadline = start + this.timeLimitMs;
    this.budget = options.budget ?? {};
    this.state = new CountState(cluster, undefined, bounds);
    this.programFits = programFits(cluster);
    if (options.formulation === "paper") checkPaperFits(cluster);
    this.program = options.formulation === "paper" ? paperProgram(this.state) : undefined;
  }

  run(): Plan {
    if (this.program) return this.ilp(this.deadline, this.budget.mipNodes) ?? this.settle();
    const exact = new Search(this.fresh(), nodeCap(this.budget.exactNodes));
    const first =
      this.budget.exactNodes === undefined
        ? this.search(exact, Math.min(this.deadline, this.start + FIRST_SLICE_MS))
        : this.search(exact, this.deadline, FIRST_SLICE_NODES);
    if (first) return first;
    const settled = this.firstPlan();
    if (settled) return settled;
    this.dive();
    if (this.proved()) return this.finish("optimal", "search", this.incumbent!, this.best);
    if (this.exactDone) return this.close();
    return this.search(exact, this.deadline) ?? this.close();
  }

  /**
   * A plan in milliseconds, however many moves: from here on there is one to return. Returns a
   * plan only where the repair failed and HiGHS then settled the question.
   */
  private firstPlan(): Plan | undefined {
    const { repairSteps, mipNodes } = this.budget;
    const repaired = repairSteps === 0 || performance.now() >= this.deadline ? undefined : repair(this.fresh(), repairSteps, undefined, this.deadline);
    if (repaired) {
      this.net = { counts: repaired, moves: moveDistance(this.state.count, repaired) };
      this.report("repair");
    } else if (repairSteps !== 0 && performance.now() < this.deadline) {
      // The repair failing is what an event with no valid placement looks like: HiGHS can prove
      // that (and then find the best effort) or find a plan, where the dives and the search
      // would run until the limit and return nothing.
      return this.ilp(mipNodes === undefined ? Math.min(this.deadline, performance.now() + ILP_SLICE_MS) : this.deadline, mipNodes);
    }
    return undefined;
  }

  /** Dives for a valid plan, narrowest beam first, each shorter than the best so far. */
  private dive(): void {
    const { diveNodes } = this.budget;
    for (const beam of DIVE_BEAMS) {
      if (this.proved() || performance.now() >= this.deadline) break;
      const until = diveNodes === undefined ? Math.min(this.deadline, performance.now() + DIVE_SLICE_MS) : this.deadline;
      const outcome = searchMoves(this.fresh(), Math.min(DIVE_DEPTH, this.best - 1), until, { firstDepth: this.lowerBound, beam, ...nodeCap(diveNodes) });
      if (outcome.kind !== "found") continue;
      this.incumbent = applyRackMoves(this.state, outcome.moves);
      this.best = outcome.moves.length;
      this.report("dive");
    }
  }

  private search(exact: Search, until: number, pauseAt?: number): Plan | undefined {
    const outcome = exact.run(Math.min(SEARCH_DEPTH, this.best - 1), until, pauseAt);
    // Deepening from below, the first plan found is minimal.
    if (outcome.kind === "found") return this.finish("optimal", "search", applyRackMoves(this.state, outcome.moves), outcome.moves.length);
    this.lowerBound = Math.max(this.lowerBound, outcome.depth + 1);
    if (this.proved()) return this.finish("optimal", "search", this.incumbent!, this.best);
    this.report("search");
    this.exactDone = (outcome.kind === "exhausted" && outcome.depth >= SEARCH_DEPTH) || exact.spent;
    return undefined;
  }

  /** Past its depth or its budget the exact search can do no more: HiGHS takes the rest. */
  private close(): Plan {
    return this.exactDone ? (this.ilp(this.deadline, this.budget.mipNodes) ?? this.settle()) : this.settle();
  }

  /** One HiGHS run from the best plan and bound so far; a plan if it settles the question. */
  private ilp(untilMs: number, nodes: number | undefined): Plan | undefined {
    if (!this.programFits) return undefined;
    this.ranIlp = true;
    this.report("ilp");
    const model = this.program ?? monkeytreeProgram(this.state, this.lowerBound);
    const solved = solveMip(this.highs, model.model, {
      timeLimitSec: ilpSeconds(untilMs - performance.now()),
      ...(this.incumbent ? { start: model.encode(this.incumbent) } : {}),
      ...(nodes === undefined ? {} : { maxNodes: nodes }),
    });
    // A plan the search or the repair found is verified; it outranks any numerical claim of
    // infeasibility. Without one, nothing else can use the time left: the best effort gets it.
    if (solved.status === "infeasible" && !this.incumbent) {
      return this.net
        ? undefined
        : ((this.program ? undefined : this.bestEffort(this.deadline)) ?? this.finish("infeasible", "ilp", this.state.count, this.lowerBound));
    }
    this.lowerBound = Math.max(this.lowerBound, Math.ceil(solved.bound * model.movesPerObjective - 1e-6));
    const found = solved.values ? model.decode(solved.values) : undefined;
    if (found && moveDistance(this.state.count, found) < this.best) {
      this.incumbent = found;
      this.best = moveDistance(this.state.count, found);
    }
    if (this.incumbent && (solved.status === "optimal" || this.best <= this.lowerBound)) return this.finish("optimal", "ilp", this.incumbent, this.best);
    return undefined;
  }

  /**
   * Where pinned jobs or unavailable hosts take the room a repair needs, the least
   * fragmentation over the rack bounds that can be reached, with the fewest moves for it.
   */
  private bestEffort(untilMs: number): Plan | undefined {
    const { cluster, highs } = this;
    if (cluster.unavailable.length === 0 && cluster.groups.every((g) => g.movable)) return undefined;
    // Only when room is what is missing: with every host usable and every job movable, a
    // placement must exist.
    const free: Cluster = { ...cluster, unavailable: [], groups: cluster.groups.map((g) => ({ ...g, movable: true })) };
    const freed = new CountState(free);
    if (solveMip(highs, monkeytreeProgram(freed).model, { timeLimitSec: ilpSeconds((untilMs - performance.now()) / 2) }).status === "infeasible")
      return undefined;
    const soft = monkeytreeProgram(this.state, 0, true);
    const solved = solveMip(highs, soft.model, { timeLimitSec: ilpSeconds(untilMs - performance.now()) });
    if (!solved.values) return undefined;
    const target = soft.decode(solved.values);
    const moves = moveDistance(this.state.count, target);
    return result(
      cluster,
      this.bounds,
      solved.status === "optimal" ? "optimal" : "feasible",
      "ilp",
      target,
      solved.status === "optimal" ? moves : 0,
      this.start,
      true,
    );
  }

  /** The best plan found, once no phase has anything more to try. */
  private settle(): Plan {
    const { net, incumbent, best, lowerBound } = this;
    if (net && net.moves < best) return this.finish(net.moves <= lowerBound ? "optimal" : "feasible", "repair", net.counts, Math.min(lowerBound, net.moves));
    if (!incumbent) throw new PlanTimeoutError(this.timeLimitMs, lowerBound, this.options.budget !== undefined);
    return this.finish(best <= lowerBound ? "optimal" : "feasible", this.ranIlp ? "ilp" : "search", incumbent, Math.min(lowerBound, best));
  }

  private finish(status: PlanStatus, method: Plan["method"], target: Counts, lowerBound: number): Plan {
    return status === "infeasible"
      ? unmoved(this.cluster, status, this.bounds, this.start, method, lowerBound)
      : result(this.cluster, this.bounds, status, method, target, lowerBound, this.start);
  }

  private proved(): boolean {
    return this.incumbent !== undefined && this.best <= this.lowerBound;
  }

  private fresh(): CountState {
    return new CountState(this.cluster, this.state.initial, this.bounds);
  }

  private report(phase: PlanProgress["phase"]): void {
    const known = Math.min(this.best, this.net?.moves ?? Number.POSITIVE_INFINITY);
    this.options.onProgress?.({
      phase,
      lowerBound: this.lowerBound,
      ...(Number.isFinite(known) ? { best: known } : {}),
      elapsedMs: performance.now() - this.start,
    });
  }
}

/**
 * A group too large for one rack (or pod) spans several whatever the plan, adding its rings to
 * each of them; when its rings alone exceed the bound, no placement exists. Saying so at once,
 * with the culprit, beats letting a search prove it exhaustively.
 */
function obviouslyInfeasible(cluster: Cluster): string | undefined {
  const { hostsPerRack, racksPerPod } = cluster.topology;
  for (const [g, group] of cluster.groups.entries()) {
    // A pinned group's rings are in its racks' floors (`plannedBounds`), not a reason.
    if (!group.movable) continue;
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
function result(
  cluster: Cluster,
  bounds: Bounds,
  status: PlanStatus,
  method: Plan["method"],
  target: Counts,
  lowerBound: number,
  start: number,
  overRacks = false,
): Plan {
  const moves = hostMoves(cluster, target);
  const after = applyMoves(cluster, moves);
  // A best effort (`overRacks`) may leave racks over: its program allows that, at a cost.
  const held = overRacks ? { racks: rackFragmentation(cluster, after).map((d, t) => Math.max(d, bounds.racks[t]!)), pods: bounds.pods } : bounds;
  if (!withinBounds(cluster, after, held)) throw new PlanError("internal: the plan leaves a rack or pod over its bound");
  return {
    status,
    moves,
    moveCount: moves.length,
    steps: new Set(moves.map((m) => m.step)).size,
    lowerBound,
    method,
    ...degrees(cluster, bounds, after, overRacks),
    placement: after,
    solveMs: performance.now() - start,
  };
}

/** A plan that moves nothing (`unchanged`, `infeasible`), in time linear in the snapshot. */
function unmoved(cluster: Cluster, status: "unchanged" | "infeasible", bounds: Bounds, start: number, method: Plan["method"] = "none", lowerBound = 0): Plan {
  return {
    status,
    moves: [],
    moveCount: 0,
    steps: 0,
    lowerBound,
    method,
    ...degrees(cluster, bounds, cluster.placement),
    placement: cluster.placement,
    solveMs: performance.now() - start,
  };
}

function degrees(cluster: Cluster, bounds: Bounds, after: Placement, overRacks = false): Pick<Plan, "fragmentation" | "podFragmentation" | "bestEffort"> {
  const rack = { before: rackFragmentation(cluster), after: after === cluster.placement ? rackFragmentation(cluster) : rackFragmentation(cluster, after) };
  const pod = cluster.podCount > 0 ? { before: podFragmentation(cluster), after: podFragmentation(cluster, after) } : undefined;
  const { unreachable } = bounds;
  const residual = (floors: typeof unreachable.racks, degree: readonly number[]) =>
    floors.map(({ index, pinned }) => ({ index, cause: "pinned" as const, pinned, after: degree[index] ?? 0 }));
  const pinnedOver = new Set(unreachable.racks.map((f) => f.index));
  const racks = [
    ...residual(unreachable.racks, rack.after),
    // Racks a best effort leaves over their bound for want of room.
    ...(overRacks
      ? rack.after.flatMap((d, index) =>
          d > bounds.racks[index]! && !pinnedOver.has(index) ? [{ index, cause: "no-room" as const, pinned: bounds.pinned.racks[index] ?? 0, after: d }] : [],
        )
      : []),
  ].sort((a, b) => a.index - b.index);
  return {
    fragmentation: rack,
    ...(pod ? { podFragmentation: pod } : {}),
    ...(racks.length + unreachable.pods.length > 0 ? { bestEffort: { racks, pods: residual(unreachable.pods, pod?.after ?? []) } } : {}),
  };
}
