import { z } from "zod";
import { InvalidInputError } from "../../sdk/contract/errors.ts";
import type { Planner } from "../planner/plan/index.ts";
import { FabricSchema } from "./fabric.ts";
import type { SimJob } from "./jobs.ts";
import type { RoutingName } from "./routing.ts";
import { SCHEDULERS } from "./scheduler.ts";
import {
  admitArrivals,
  advance,
  nextEventTime,
  settleRestarts,
  settleRunning,
  settleTransfers,
  simulating,
  startQueued,
  systemRun,
} from "./simulate-events.ts";
import { refreshRates } from "./simulate-network.ts";
import { planAfterEvent } from "./simulate-planning.ts";
import { createSimState } from "./simulate-state.ts";

/**
 * The systems compared (paper §7.1): routing alone, or MonkeyTree's migrations in front of a
 * routing. `monkeytree` is MonkeyTree with Perfect routing; `spray` is packet spraying on a
 * full-bisection fabric, the ideal. `monkeytree3` (a 3-tier Clos only) bounds every pod's
 * fragmentation as well as every rack's; `monkeytree` there bounds racks only.
 */
export const SYSTEMS = [
  "ecmp",
  "crux",
  "sglb",
  "perfect",
  "monkeytree",
  "monkeytree-ecmp",
  "monkeytree-crux",
  "monkeytree-sglb",
  "spray",
  "monkeytree3",
] as const;
export type SystemName = (typeof SYSTEMS)[number];
/** The systems that run on any fabric: all but MonkeyTree3, which needs pods. */
export const SYSTEMS_2TIER = SYSTEMS.filter((s) => s !== "monkeytree3");

export function systemSpec(name: SystemName): { routing: RoutingName; migrate: boolean; podBound: boolean } {
  if (name === "monkeytree" || name === "monkeytree3") return { routing: "perfect", migrate: true, podBound: name === "monkeytree3" };
  if (name.startsWith("monkeytree-")) return { routing: name.slice("monkeytree-".length) as RoutingName, migrate: true, podBound: false };
  return { routing: name as RoutingName, migrate: false, podBound: false };
}

export const QUEUES = ["fifo", "backfill"] as const;
export type QueueName = (typeof QUEUES)[number];

/**
 * The planner's time limit where planning costs no simulated time: long, so that the work caps
 * (`planBudget`) end a plan first and a replay takes the same path on any machine.
 */
export const FREE_PLAN_TIME_LIMIT_MS = 60_000;

export const SimConfigSchema = z.strictObject({
  fabric: FabricSchema,
  /** Per-rack fragmentation bound MonkeyTree keeps; defaults to the uplinks per rack. */
  lambda: z.int().min(0).optional(),
  /** Per-pod bound MonkeyTree3 keeps; defaults to a pod's core-facing links (uplinksPerRack × aggUplinks). */
  podLambda: z.int().min(0).optional(),
  scheduler: z.enum(SCHEDULERS).default("best-fit"),
  /**
   * How the queue is served: `fifo` starts jobs in arrival order and the head blocks everyone
   * behind it; `backfill` walks the queue in order and starts every job the front-end can place
   * now, as Slurm's backfill does, but without reserving hosts for the jobs it passes over.
   */
  queue: z.enum(QUEUES).default("fifo"),
  /**
   * Whether the queue starts jobs while a migration's jobs head for their barrier and move
   * their state (`place`), or waits until those moves are done (`hold`), as the paper's
   * simulator does; both place during the restart after.
   */
  queueInMoves: z.enum(["place", "hold"]).default("place"),
  /**
   * How a plan's jobs move: `plan`, together, as the controller moves a plan step (every job
   * waits for the plan's last barrier, its last transfer and one restart); `job`, each on its
   * own, as the paper's simulator moves them: its transfers start once it and the jobs it
   * displaces have stopped, and it restarts once its own state arrived.
   */
  migrateBy: z.enum(["plan", "job"]).default("plan"),
  /** Seeds the queue pairs' source ports (ECMP), SGLB's choices and the random scheduler. */
  seed: z.int().default(1),
  /** Re-initialisation after a migration's transfers, before the moved jobs resume (paper: 10 s). */
  restartSeconds: z.number().min(0).default(10),
  /** The planner's time per event. */
  planTimeLimitMs: z.int().min(1).default(FREE_PLAN_TIME_LIMIT_MS),
  /**
   * What planning costs in simulated time: `free`, nothing, as the paper's simulator charges it
   * (the cluster is planned in an instant); `solve`, the planner's own solve time, at most
   * `planTimeLimitMs`, during which the cluster runs on. A plan whose cluster changed meanwhile
   * (a job started, ended or finished moving) is discarded and the cluster planned again, as the
   * controller does. `solve` makes a run depend on the machine's speed.
   */
  planTime: z.enum(["free", "solve"]).default("free"),
  /**
   * Work caps on every plan, so that a replay takes the same path on any machine (the time
   * limit alone would make plans depend on the machine's speed). HiGHS solves the root of its
   * program but does not branch: on the fig-slowdown, fig-threshold (λ = 2) and fig-frontend
   * (random) traces, 200 branch-and-bound nodes changed no plan of any event, and cost up to
   * 18 s on one (a node of a 1,024-GPU program takes about 0.45 s).
   */
  planBudget: z
    .strictObject({ exactNodes: z.int().min(0), diveNodes: z.int().min(0), mipNodes: z.int().min(0) })
    .default({ exactNodes: 200_000, diveNodes: 50_000, mipNodes: 0 }),
  sglbK: z.int().min(1).default(2),
});
export type SimConfig = z.infer<typeof SimConfigSchema>;
export type SimConfigInput = z.input<typeof SimConfigSchema>;

export interface JobOutcome {
  readonly id: string;
  readonly arrival: number;
  readonly start: number;
  readonly finish: number;
  /** Seconds it would run alone on the fabric, never moved. */
  readonly ideal: number;
  /** (finish − start) ÷ ideal. */
  readonly slowdown: number;
  /** Workers of the job moved over its life. */
  readonly moves: number;
}

// Declared beside the planning step that reports it.
export { STALE_PLAN } from "./simulate-planning.ts";

/** One time MonkeyTree found a rack over its bound and planned. */
export interface PlanEvent {
  readonly time: number;
  /** The planner's status, or `STALE_PLAN` (`planTime: solve`). */
  readonly status: string;
  readonly moves: number;
  readonly solveMs: number;
}

/**
 * The cluster's fragmentation after an event: rack degrees' maximum, mean and sum (the
 * paper's total fragmentation, §7.3), and fragmented groups.
 */
export interface FragmentationSample {
  readonly time: number;
  readonly maxRack: number;
  readonly meanRack: number;
  readonly total: number;
  readonly fragmentedGroups: number;
}

export interface SimObserver {
  readonly jobDone?: (outcome: JobOutcome) => void;
  readonly planned?: (event: PlanEvent) => void;
  readonly sample?: (sample: FragmentationSample) => void;
}

export interface SystemRun {
  readonly system: SystemName;
  readonly jobs: readonly JobOutcome[];
  readonly plans: readonly PlanEvent[];
  /** Seconds from each plan's start to its jobs resuming. */
  readonly migrationSeconds: readonly number[];
  readonly bytesMoved: number;
  readonly makespanSeconds: number;
  /** Time averages over the run, and the peaks of the per-rack maximum and of the total. */
  readonly fragmentation: {
    readonly peakMaxRack: number;
    readonly meanMaxRack: number;
    readonly meanRack: number;
    readonly peakTotal: number;
    readonly meanTotal: number;
    readonly meanFragmentedGroups: number;
  };
}

/**
 * Runs one system over a trace, event by event: arrivals, the front-end scheduler's
 * placements behind a FIFO or backfilling queue, completions and migrations. Between events
 * every flow's rate is constant (max-min fair over the fabric), so the clock jumps to the next
 * event and cost grows with events, not simulated time.
 *
 * A job's iteration is its compute, with the pipeline transfers between stages overlapped
 * with it, then its DP rings' all-reduce (each ring one flow that moves at its slowest hop's
 * rate). Pipeline flows want only the rate that hides them behind compute (their demand), so
 * they are the mice the paper describes; rings take what max-min fairness gives them. An
 * expert-parallel job's all-to-all follows its all-reduce: one flow over every pair of a
 * stage's hosts on every NIC. All running jobs are taken to communicate at once, the worst
 * alignment, except that a job's own all-reduce and all-to-all take turns.
 *
 * MonkeyTree systems call the planner as the controller does: whenever the cluster is over
 * its bound and no migration is in flight, after arrivals, departures and finished
 * migrations. A migration stops its jobs at their next iteration barrier, moves each step's
 * checkpoints as flows (ECMP-hashed, one per NIC), waits `restartSeconds`, and resumes them.
 *
 * Pure and synchronous: the same jobs, config and planner give the same result.
 */
export function simulateSystem(
  jobs: readonly SimJob[],
  input: SimConfigInput,
  system: SystemName,
  planner: Planner | undefined,
  observer: SimObserver = {},
): SystemRun {
  const parsedConfig = SimConfigSchema.safeParse(input);
  if (!parsedConfig.success) throw InvalidInputError.fromZod("simulation config", parsedConfig.error);
  const state = createSimState(jobs, parsedConfig.data, system, systemSpec(system), planner, observer);
  while (simulating(state)) {
    refreshRates(state);
    advance(state, Math.max(state.now, nextEventTime(state)));
    // What came due, in this order: jobs at their barrier or end, transfers, restarts, arrivals.
    const finished = settleRunning(state);
    settleTransfers(state);
    const restarted = settleRestarts(state);
    admitArrivals(state);
    const started = startQueued(state);
    planAfterEvent(state, finished || restarted || started);
  }
  return systemRun(state);
}
