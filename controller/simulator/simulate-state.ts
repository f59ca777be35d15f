// The state one `simulateSystem` run carries from event to event, and the few reads of it that
// every step shares. The steps live beside it: simulate-network.ts (routes and rates),
// simulate-migration.ts (a plan's moves), simulate-planning.ts (when to plan) and
// simulate-events.ts (the clock, arrivals, departures and the result).
import { InvalidInputError } from "../../sdk/contract/errors.ts";
import { clusterFromSnapshot, type Cluster } from "../planner/model/cluster.ts";
import type { Snapshot } from "../planner/model/snapshot.ts";
import type { Move, Plan, Planner } from "../planner/plan/index.ts";
import type { DpFlow, PpFlow } from "../planner/route/index.ts";
import { Fabric } from "./fabric.ts";
import type { SimJob } from "./jobs.ts";
import { Random } from "./random.ts";
import { RouteMemo, type OtherFlow, type RoutingName } from "./routing.ts";
import { scheduler as schedulerNamed, type Scheduler } from "./scheduler.ts";
import type { JobOutcome, PlanEvent, SimConfig, SimObserver, SystemName } from "./simulate.ts";

/** How a system routes, and whether and to which bounds it migrates (`systemSpec`). */
export interface SystemSpec {
  readonly routing: RoutingName;
  readonly migrate: boolean;
  readonly podBound: boolean;
}

export interface Running {
  readonly job: SimJob;
  readonly start: number;
  /** Hosts of each stage, in ring order. */
  groups: number[][];
  progress: number;
  /** Iterations per second at the current rates. */
  rate: number;
  /** The iteration barrier it stops at for a pending migration. */
  stopAt: number | undefined;
  paused: boolean;
  moves: number;
}

export interface Transfer {
  readonly links: number[];
  remaining: number;
  rate: number;
}

/** Jobs of a plan that move together: all of them, or one (`migrateBy`). */
export interface Migration {
  readonly started: number;
  readonly jobs: Set<string>;
  readonly steps: Move[][];
  step: number;
  phase: "barrier" | "transfer" | "restart";
  transfers: Transfer[];
  restartEnds: number;
}

/** One cross-rack sub-flow of a stage's all-to-all: host to host on one NIC. */
export interface A2aFlow extends OtherFlow {
  readonly group: number;
}

/** A plan still being computed in simulated time (`planTime: solve`), and the placement it is for. */
export interface ComputingPlan {
  readonly plan: Plan;
  readonly time: number;
  readonly ready: number;
  readonly placement: number;
}

/** The peaks of the fragmentation samples, their integrals over time, and the sample in force. */
export interface FragmentationTally {
  peakMaxRack: number;
  peakTotal: number;
  maxIntegral: number;
  totalIntegral: number;
  groupsIntegral: number;
  current: { max: number; total: number; groups: number };
}

/**
 * Everything a run shares between its steps. The first block is fixed when the run starts; the
 * rest changes as events happen.
 */
export interface SimState {
  readonly jobs: readonly SimJob[];
  readonly config: SimConfig;
  readonly system: SystemName;
  readonly spec: SystemSpec;
  readonly planner: Planner | undefined;
  readonly observer: SimObserver;
  readonly fabric: Fabric;
  /** The front-end scheduler that places queued jobs. */
  readonly place: Scheduler;
  /** A NIC's bytes per second. */
  readonly nic: number;
  /** What every cluster of the run shares: topology and bounds. */
  readonly shape: Omit<Snapshot, "jobs">;
  /** The cluster with no jobs: ring order needs only its topology. */
  readonly shapeOnly: Cluster;
  readonly memo: RouteMemo;

  /** Hosts running a worker, and the destinations a migration in flight has reserved. */
  readonly occupied: boolean[];
  readonly running: Map<string, Running>;
  readonly queue: SimJob[];
  readonly outcomes: JobOutcome[];
  readonly plans: PlanEvent[];
  readonly migrationSeconds: number[];
  bytesMoved: number;
  /** The plan in flight, in the parts that move on their own; empty when none is. */
  migrations: Migration[];
  computing: ComputingPlan | undefined;
  /** Counts placement changes: a plan computed for an older count is stale. */
  placements: number;
  now: number;
  /** The index in `jobs` of the next job to arrive. */
  nextArrival: number;
  routesDirty: boolean;
  ratesDirty: boolean;
  /** The running jobs as the controller sees them, as of the last routing. */
  cluster: Cluster;
  flows: { dp: DpFlow[]; pp: PpFlow[]; a2a: A2aFlow[] };
  /** Each flow's fabric links, resolved once per routing: rates are computed far more often. */
  linksOf: { dp: number[][]; pp: number[][]; a2a: number[][] };
  readonly fragmentation: FragmentationTally;
}

/** Events within this many seconds (relative to the clock) happen together. */
export const SAME_TIME = 1e-9;

/**
 * The state before the first event: nothing runs, nothing is queued. Checks what the parsed
 * config and the jobs must agree on (a planner for a migrating system, pods for MonkeyTree3,
 * jobs that fit the cluster).
 */
export function createSimState(
  jobs: readonly SimJob[],
  config: SimConfig,
  system: SystemName,
  spec: SystemSpec,
  planner: Planner | undefined,
  observer: SimObserver,
): SimState {
  if (spec.migrate && !planner) throw new RangeError(`${system} migrates, so it needs a planner`);
  const fabric = new Fabric(config.fabric, spec.routing === "spray");
  const { racks, hostsPerRack, gpusPerHost, uplinksPerRack, racksPerPod, aggUplinks } = config.fabric;
  if (spec.podBound && (racksPerPod === undefined || aggUplinks === undefined)) {
    throw new InvalidInputError("simulation config", [
      {
        path: "fabric.racksPerPod",
        message: `${system} bounds pods, so it needs a 3-tier fabric: give racksPerPod and aggUplinks (the paper-3tier preset), or leave ${system} out`,
      },
    ]);
  }
  // The controller sees pods whenever the fabric has them; only MonkeyTree3 plans to their bound.
  const topology = { racks, hostsPerRack, gpusPerHost, uplinksPerRack, ...(racksPerPod === undefined ? {} : { racksPerPod }) };
  const lambda = config.lambda ?? uplinksPerRack;
  const podLambda = spec.podBound ? { podLambda: config.podLambda ?? uplinksPerRack * aggUplinks! } : {};
  const hostCount = fabric.hostCount;
  jobs.forEach((job, i) => {
    if (job.stages * job.hostsPerStage > hostCount) {
      throw new InvalidInputError("trace", [
        { path: `[${i}]`, message: `job ${job.id} needs ${job.stages * job.hostsPerStage} hosts; the cluster has ${hostCount}` },
      ]);
    }
  });
  const shape = { topology, lambda, ...podLambda };
  const shapeOnly = clusterFromSnapshot({ ...shape, jobs: [] });
  return {
    jobs,
    config,
    system,
    spec,
    planner,
    observer,
    fabric,
    place: schedulerNamed(config.scheduler, new Random(config.seed)),
    nic: fabric.nicBytesPerSecond,
    shape,
    shapeOnly,
    memo: new RouteMemo(),
    occupied: new Array<boolean>(hostCount).fill(false),
    running: new Map(),
    queue: [],
    outcomes: [],
    plans: [],
    migrationSeconds: [],
    bytesMoved: 0,
    migrations: [],
    computing: undefined,
    placements: 0,
    now: 0,
    nextArrival: 0,
    routesDirty: true,
    ratesDirty: true,
    cluster: shapeOnly,
    flows: { dp: [], pp: [], a2a: [] },
    linksOf: { dp: [], pp: [], a2a: [] },
    fragmentation: { peakMaxRack: 0, peakTotal: 0, maxIntegral: 0, totalIntegral: 0, groupsIntegral: 0, current: { max: 0, total: 0, groups: 0 } },
  };
}

/** The running jobs as the controller sees them. */
export function clusterOfRunning(state: SimState): Cluster {
  return clusterFromSnapshot({
    ...state.shape,
    // The controller orders jobs by id, so plans do not depend on arrival order.
    jobs: [...state.running.values()]
      .sort((a, b) => (a.job.id < b.job.id ? -1 : a.job.id > b.job.id ? 1 : 0))
      .map((r) => ({ id: r.job.id, rings: r.job.rings, groups: r.groups })),
  });
}

/** Marks the hosts running a worker, and the destinations a migration in flight has reserved. */
export function recomputeOccupancy(state: SimState): void {
  const { occupied } = state;
  occupied.fill(false);
  for (const r of state.running.values()) for (const hosts of r.groups) for (const h of hosts) occupied[h] = true;
  for (const m of state.migrations) for (const step of m.steps) for (const move of step) occupied[move.to] = true;
}

/** Whether time `t` has come: it is no later than the clock, give or take `SAME_TIME`. */
export function isDue(state: SimState, t: number): boolean {
  return t <= state.now + SAME_TIME * Math.max(1, state.now);
}

/** Seconds until a running job reaches its barrier, or its last iteration, at its current rate. */
export function secondsToTarget(r: Running): number {
  return Math.max(0, (r.stopAt ?? r.job.iterations) - r.progress) / r.rate;
}
