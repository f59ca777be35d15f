import { z } from "zod";
import { InvalidInputError } from "../../sdk/errors.ts";
import { clusterFromSnapshot, type Cluster } from "../model/cluster.ts";
import { rackFragmentation, withinBounds } from "../model/fragmentation.ts";
import type { Move, Plan, Planner } from "../plan/index.ts";
import { dpFlows, ppFlows, ringOrder, type DpFlow, type PpFlow } from "../route/index.ts";
import { Fabric, FabricSchema } from "./fabric.ts";
import { idealRates, iterationSeconds, type SimJob } from "./jobs.ts";
import { maxMinRates } from "./maxmin.ts";
import { Random } from "./random.ts";
import { choosePaths, ecmpChoices, ringRail, RouteMemo, type OtherFlow, type RoutingName } from "./routing.ts";
import { SCHEDULERS, scheduler as schedulerNamed } from "./scheduler.ts";

/**
 * The systems compared (paper §7.1): routing alone, or MonkeyTree's migrations in front of a
 * routing. `monkeytree` is MonkeyTree with Perfect routing; `spray` is packet spraying on a
 * full-bisection fabric, the ideal. `monkeytree3` (a 3-tier Clos only) bounds every pod's
 * fragmentation as well as every rack's; `monkeytree` there bounds racks only.
 */
export const SYSTEMS = ["ecmp", "crux", "sglb", "perfect", "monkeytree", "monkeytree-ecmp", "monkeytree-crux", "monkeytree-sglb", "spray", "monkeytree3"] as const;
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

/** A plan's status when the cluster changed while it was computed, and nothing moved. */
export const STALE_PLAN = "stale";

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

interface Running {
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

interface Transfer {
  readonly links: number[];
  remaining: number;
  rate: number;
}

/** Jobs of a plan that move together: all of them, or one (`migrateBy`). */
interface Migration {
  readonly started: number;
  readonly jobs: Set<string>;
  readonly steps: Move[][];
  step: number;
  phase: "barrier" | "transfer" | "restart";
  transfers: Transfer[];
  restartEnds: number;
}

/** Events within this many seconds (relative to the clock) happen together. */
const SAME_TIME = 1e-9;

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
export function simulateSystem(jobs: readonly SimJob[], input: SimConfigInput, system: SystemName, planner: Planner | undefined, observer: SimObserver = {}): SystemRun {
  const parsedConfig = SimConfigSchema.safeParse(input);
  if (!parsedConfig.success) throw InvalidInputError.fromZod("simulation config", parsedConfig.error);
  const config = parsedConfig.data;
  const spec = systemSpec(system);
  if (spec.migrate && !planner) throw new RangeError(`${system} migrates, so it needs a planner`);
  const fabric = new Fabric(config.fabric, spec.routing === "spray");
  const { racks, hostsPerRack, gpusPerHost, uplinksPerRack, racksPerPod, aggUplinks } = config.fabric;
  if (spec.podBound && (racksPerPod === undefined || aggUplinks === undefined)) {
    throw new InvalidInputError("simulation config", [{ path: "fabric.racksPerPod", message: `${system} bounds pods, so it needs a 3-tier fabric: give racksPerPod and aggUplinks (the paper-3tier preset), or leave ${system} out` }]);
  }
  // The controller sees pods whenever the fabric has them; only MonkeyTree3 plans to their bound.
  const topology = { racks, hostsPerRack, gpusPerHost, uplinksPerRack, ...(racksPerPod === undefined ? {} : { racksPerPod }) };
  const lambda = config.lambda ?? uplinksPerRack;
  const podLambda = spec.podBound ? { podLambda: config.podLambda ?? uplinksPerRack * aggUplinks! } : {};
  const hostCount = fabric.hostCount;
  jobs.forEach((job, i) => {
    if (job.stages * job.hostsPerStage > hostCount) {
      throw new InvalidInputError("trace", [{ path: `[${i}]`, message: `job ${job.id} needs ${job.stages * job.hostsPerStage} hosts; the cluster has ${hostCount}` }]);
    }
  });
  const random = new Random(config.seed);
  const place = schedulerNamed(config.scheduler, random);
  const nic = fabric.nicBytesPerSecond;
  const shapeOnly = clusterFromSnapshot({ topology, lambda, ...podLambda, jobs: [] });

  const occupied = new Array<boolean>(hostCount).fill(false);
  const running = new Map<string, Running>();
  const queue: SimJob[] = [];
  const outcomes: JobOutcome[] = [];
  const plans: PlanEvent[] = [];
  const migrationSeconds: number[] = [];
  let bytesMoved = 0;
  // The plan in flight, in the parts that move on their own; empty when none is.
  let migrations: Migration[] = [];
  /** A plan still being computed in simulated time (`planTime: solve`), and the placement it is for. */
  let computing: { readonly plan: Plan; readonly time: number; readonly ready: number; readonly placement: number } | undefined;
  /** Counts placement changes: a plan computed for an older count is stale. */
  let placements = 0;
  let now = 0;
  let nextArrival = 0;
  let routesDirty = true;
  let ratesDirty = true;
  let cluster: Cluster = shapeOnly;
  let flows: { dp: DpFlow[]; pp: PpFlow[]; a2a: A2aFlow[] } = { dp: [], pp: [], a2a: [] };
  // Each flow's fabric links, resolved once per routing: rates are computed far more often.
  let linksOf: { dp: number[][]; pp: number[][]; a2a: number[][] } = { dp: [], pp: [], a2a: [] };
  const fragmentation = { peakMaxRack: 0, peakTotal: 0, maxIntegral: 0, totalIntegral: 0, groupsIntegral: 0, current: { max: 0, total: 0, groups: 0 } };

  const ideal = (job: SimJob) => job.iterations * iterationSeconds(job, idealRates(nic, gpusPerHost));

  const clusterOfRunning = (): Cluster =>
    clusterFromSnapshot({
      topology,
      lambda,
      ...podLambda,
      // The controller orders jobs by id, so plans do not depend on arrival order.
      jobs: [...running.values()]
        .sort((a, b) => (a.job.id < b.job.id ? -1 : a.job.id > b.job.id ? 1 : 0))
        .map((r) => ({ id: r.job.id, rings: r.job.rings, groups: r.groups })),
    });

  const sample = () => {
    const degrees = rackFragmentation(cluster);
    const max = Math.max(0, ...degrees);
    const total = degrees.reduce((a, b) => a + b, 0);
    const fragmentedGroups = cluster.placement.filter((hosts) => new Set(hosts.map((h) => fabric.rackOf(h))).size > 1).length;
    fragmentation.current = { max, total, groups: fragmentedGroups };
    fragmentation.peakMaxRack = Math.max(fragmentation.peakMaxRack, max);
    fragmentation.peakTotal = Math.max(fragmentation.peakTotal, total);
    observer.sample?.({ time: now, maxRack: max, meanRack: total / Math.max(1, degrees.length), total, fragmentedGroups });
  };

  const memo = new RouteMemo();
  const reroute = () => {
    cluster = clusterOfRunning();
    const dp = dpFlows(cluster, cluster.placement);
    const pp = ppFlows(cluster, cluster.placement);
    const a2a = allToAllFlows(cluster, (id) => running.get(id)!.job.a2aBytes > 0, gpusPerHost, fabric);
    const choice = choosePaths(spec.routing, cluster, dp, pp, a2a, {
      fabric,
      seed: config.seed,
      sglbK: config.sglbK,
      memo,
      intensity: (id) => intensity(running.get(id)?.job, nic),
      share: (id) => {
        const job = running.get(id)!.job;
        return { dp: job.ringBytes > 0 ? 1 : 0, pp: ppDemand(job, nic) / nic };
      },
    });
    flows = { dp, pp, a2a };
    linksOf = {
      dp: dp.map((f, i) => fabric.route(f.srcRack, f.dstRack, ringRail(cluster, f, gpusPerHost), choice.dp[i]!)),
      pp: pp.map((f, i) => fabric.route(f.srcRack, f.dstRack, f.replica, choice.pp[i]!)),
      a2a: a2a.map((f, i) => fabric.route(f.srcRack, f.dstRack, f.nic, choice.other[i]!)),
    };
    routesDirty = false;
    ratesDirty = true;
    sample();
  };
  const rerate = () => {
    const paths: number[][] = [];
    const demands: number[] = [];
    // Group g's ring k is entity firstRing[g] + k; -1: the group's rings cross no shared link.
    const firstRing = new Int32Array(cluster.groups.length).fill(-1);
    const ppEntities = new Map<string, number[]>();
    cluster.groups.forEach((group, g) => {
      const r = running.get(group.job)!;
      const hosts = cluster.placement[g]!;
      if (r.paused || hosts.length < 2 || r.job.ringBytes === 0) return;
      // A job's phases never overlap and hosts are not shared, so a NIC only bounds its
      // own flow: ring k sends once and receives once on NIC k of every host.
      firstRing[g] = paths.length;
      for (let ring = 0; ring < group.rings; ring++) {
        paths.push([]);
        demands.push(nic);
      }
    });
    flows.dp.forEach((f, i) => {
      if (firstRing[f.group] === -1) return;
      paths[firstRing[f.group]! + f.ring]!.push(...linksOf.dp[i]!);
    });
    flows.pp.forEach((f, i) => {
      const job = cluster.groups[f.fromGroup]!.job;
      const r = running.get(job)!;
      if (r.paused) return;
      // Pipeline transfers happen during compute, never beside the job's own all-reduce,
      // so they contend in the fabric only.
      const list = ppEntities.get(job) ?? [];
      list.push(paths.length);
      ppEntities.set(job, list);
      paths.push(linksOf.pp[i]!);
      demands.push(ppDemand(r.job, nic));
    });
    // A stage's all-to-all is one flow: every pair of its hosts on every NIC, in lockstep.
    const a2aEntity = new Map<number, number>();
    cluster.groups.forEach((group, g) => {
      const r = running.get(group.job)!;
      const hosts = cluster.placement[g]!;
      if (r.paused || hosts.length < 2 || r.job.a2aBytes === 0) return;
      // Every NIC sends to, and receives from, each of the other hosts once.
      a2aEntity.set(g, paths.length);
      paths.push([]);
      demands.push(nic / (hosts.length - 1));
    });
    flows.a2a.forEach((f, i) => {
      const entity = a2aEntity.get(f.group);
      if (entity === undefined) return;
      paths[entity]!.push(...linksOf.a2a[i]!);
    });
    const transfers = migrations.flatMap((m) => m.transfers);
    const firstTransfer = paths.length;
    for (const t of transfers) {
      paths.push(t.links);
      demands.push(Infinity);
    }
    const solve = (without: readonly number[] = []) => {
      if (paths.length === 0) return new Float64Array(0);
      if (without.length === 0) return maxMinRates({ capacities: fabric.capacities, flows: paths, demands });
      // A left-out flow crosses nothing and wants nothing.
      const gone = new Set(without);
      return maxMinRates({
        capacities: fabric.capacities,
        flows: paths.map((links, e) => (gone.has(e) ? [] : links)),
        demands: demands.map((d, e) => (gone.has(e) ? 0 : d)),
      });
    };
    const rates = solve();
    transfers.forEach((t, i) => (t.rate = rates[firstTransfer + i]!));
    const ringsOf = new Map<string, number[]>();
    cluster.groups.forEach((group, g) => {
      if (firstRing[g] === -1) return;
      const entities = ringsOf.get(group.job) ?? [];
      for (let ring = 0; ring < group.rings; ring++) entities.push(firstRing[g]! + ring);
      ringsOf.set(group.job, entities);
    });
    const a2aOf = new Map<string, number[]>();
    for (const [g, entity] of a2aEntity) a2aOf.set(cluster.groups[g]!.job, [...(a2aOf.get(cluster.groups[g]!.job) ?? []), entity]);
    // A job's all-reduce and all-to-all take turns, so each meets everyone's traffic but the
    // other's: one solve without its all-to-all, one without its rings. Where the other phase
    // stays inside racks it crosses no shared link, and leaving it out changes nothing.
    const solveWithout = (own: readonly number[] | undefined) => (own?.some((e) => paths[e]!.length > 0) ? solve(own) : rates);
    const ringRate = new Map<string, number>();
    for (const [job, entities] of ringsOf) {
      const from = solveWithout(a2aOf.get(job));
      ringRate.set(job, Math.min(...entities.map((e) => from[e]!)));
    }
    // Each host sends to every other host of its stage on every NIC at the flow's rate.
    const a2aRate = new Map<string, number>();
    const sizeOf = new Map([...a2aEntity].map(([g, entity]) => [entity, cluster.placement[g]!.length]));
    for (const [job, entities] of a2aOf) {
      const from = solveWithout(ringsOf.get(job));
      a2aRate.set(job, Math.min(...entities.map((e) => from[e]! * (sizeOf.get(e)! - 1) * gpusPerHost)));
    }
    for (const r of running.values()) {
      if (r.paused) {
        r.rate = 0;
        continue;
      }
      // Pipeline flows inside a rack are held only by the NIC.
      const pp = Math.min(nic, ...(ppEntities.get(r.job.id) ?? []).map((e) => rates[e]!));
      r.rate = 1 / iterationSeconds(r.job, { ring: ringRate.get(r.job.id) ?? Infinity, pp, a2a: a2aRate.get(r.job.id) ?? Infinity, host: nic * gpusPerHost });
    }
    ratesDirty = false;
  };

  /** Hosts running a worker, and the destinations a migration in flight has reserved. */
  const recomputeOccupancy = () => {
    occupied.fill(false);
    for (const r of running.values()) for (const hosts of r.groups) for (const h of hosts) occupied[h] = true;
    for (const m of migrations) for (const step of m.steps) for (const move of step) occupied[move.to] = true;
  };

  const finishJob = (r: Running) => {
    running.delete(r.job.id);
    const idealSeconds = ideal(r.job);
    const outcome: JobOutcome = {
      id: r.job.id,
      arrival: r.job.arrival,
      start: r.start,
      finish: now,
      ideal: idealSeconds,
      slowdown: idealSeconds > 0 ? (now - r.start) / idealSeconds : 1,
      moves: r.moves,
    };
    if (!r.job.warmup) {
      outcomes.push(outcome);
      observer.jobDone?.(outcome);
    }
    const m = migrations.find((candidate) => candidate.jobs.has(r.job.id));
    if (m) {
      m.jobs.delete(r.job.id);
      // Its moves are moot: its hosts are free now, which only helps the other moves.
      for (const step of m.steps) step.splice(0, step.length, ...step.filter((move) => move.job !== r.job.id));
      if (m.jobs.size === 0) migrations = migrations.filter((other) => other !== m);
    }
    recomputeOccupancy();
    routesDirty = true;
    // Gone, it holds up no part that waited for it: its own, or one moving onto its hosts.
    beginTransfersIfReady();
  };

  const startQueued = (): boolean => {
    if (config.queueInMoves === "hold" && migrations.some((m) => m.phase !== "restart")) return false;
    let started = false;
    for (let i = 0; i < queue.length; ) {
      const job = queue[i]!;
      const groups = place(occupied, hostsPerRack, new Array<number>(job.stages).fill(job.hostsPerStage));
      if (!groups) {
        if (config.queue === "fifo") break;
        i++;
        continue;
      }
      queue.splice(i, 1);
      for (const hosts of groups) for (const h of hosts) occupied[h] = true;
      // As the controller starts a job: each group in ring order.
      const ordered = groups.map((hosts) => ringOrder(shapeOnly, hosts));
      running.set(job.id, { job, start: now, groups: ordered, progress: 0, rate: 0, stopAt: undefined, paused: false, moves: 0 });
      started = true;
    }
    if (started) routesDirty = true;
    return started;
  };

  const planned = (event: PlanEvent) => {
    plans.push(event);
    observer.planned?.(event);
  };

  const maybePlan = () => {
    if (!spec.migrate || !planner || migrations.length > 0 || computing) return;
    if (routesDirty) reroute();
    if (withinBounds(cluster)) return;
    let plan;
    try {
      plan = planner.plan(cluster, { timeLimitMs: config.planTimeLimitMs, budget: config.planBudget });
    } catch (error) {
      return planned({ time: now, status: error instanceof Error ? error.name : "error", moves: 0, solveMs: 0 });
    }
    if (config.planTime === "solve" && plan.moves.length > 0) {
      computing = { plan, time: now, ready: now + Math.min(plan.solveMs, config.planTimeLimitMs) / 1000, placement: placements };
      return;
    }
    planned({ time: now, status: plan.status, moves: plan.moveCount, solveMs: plan.solveMs });
    migrate(plan);
  };

  /** The plan computed in simulated time arrives: carried out, or discarded if the cluster changed meanwhile. */
  const planArrived = () => {
    const { plan, time, placement } = computing!;
    computing = undefined;
    const stale = placement !== placements;
    planned({ time, status: stale ? STALE_PLAN : plan.status, moves: stale ? 0 : plan.moveCount, solveMs: plan.solveMs });
    if (stale) maybePlan();
    else migrate(plan);
  };

  const migrate = (plan: Plan) => {
    if (plan.moves.length === 0) return;
    const parts = config.migrateBy === "plan" ? [plan.moves] : [...new Set(plan.moves.map((m) => m.job))].map((job) => plan.moves.filter((m) => m.job === job));
    migrations = parts.map((moves) => {
      const steps: Move[][] = [];
      for (const m of moves) (steps[m.step] ??= []).push(m);
      return { started: now, jobs: new Set(moves.map((m) => m.job)), steps: steps.filter(Boolean), step: -1, phase: "barrier", transfers: [], restartEnds: 0 };
    });
    recomputeOccupancy();
    for (const m of migrations) {
      for (const id of m.jobs) {
        const r = running.get(id)!;
        r.stopAt = Math.min(r.job.iterations, Math.ceil(r.progress - SAME_TIME));
        if (r.stopAt <= r.progress + SAME_TIME && r.stopAt < r.job.iterations) pause(r);
      }
    }
    beginTransfersIfReady();
  };

  const pause = (r: Running) => {
    r.progress = r.stopAt ?? r.progress;
    r.paused = true;
    ratesDirty = true;
  };

  /**
   * Starts the transfers of every part whose jobs wait at their barrier, as do the jobs on its
   * destinations: a part moved on its own (`migrateBy: job`) goes once the jobs it displaces
   * have stopped, as the paper's simulator moves them, and restarts once its own state arrived.
   */
  const beginTransfersIfReady = () => {
    for (const m of [...migrations]) {
      if (m.phase !== "barrier") continue;
      const to = new Set(m.steps.flatMap((step) => step.map((move) => move.to)));
      const holds = (r: Running) => m.jobs.has(r.job.id) || r.groups.some((hosts) => hosts.some((h) => to.has(h)));
      if ([...running.values()].some((r) => holds(r) && !r.paused)) continue;
      m.phase = "transfer";
      nextStep(m);
    }
  };

  const nextStep = (m: Migration) => {
    m.step++;
    ratesDirty = true;
    if (m.step >= m.steps.length) {
      m.phase = "restart";
      m.transfers = [];
      m.restartEnds = now + config.restartSeconds;
      return;
    }
    m.transfers = m.steps[m.step]!.flatMap((move) => {
      const bytes = running.get(move.job)!.job.checkpointBytes / gpusPerHost;
      if (bytes === 0) return [];
      bytesMoved += bytes * gpusPerHost;
      return Array.from({ length: gpusPerHost }, (_, nicIndex) => {
        const choices = ecmpChoices(fabric, { srcHost: move.from, dstHost: move.to }, `checkpoint/${move.job}/${move.from}>${move.to}/${nicIndex}`, config.seed);
        return { links: fabric.path(move.from, move.to, nicIndex, choices), remaining: bytes, rate: 0 };
      });
    });
    if (m.transfers.length === 0) nextStep(m);
  };

  const endMigration = (m: Migration) => {
    migrations = migrations.filter((other) => other !== m);
    for (const step of m.steps) {
      for (const move of step) {
        const r = running.get(move.job)!;
        r.groups = r.groups.map((hosts, g) => {
          if (g !== move.group) return hosts;
          const moved = hosts.map((h) => (h === move.from ? move.to : h));
          return ringOrder(shapeOnly, moved, moved);
        });
        r.moves++;
      }
    }
    for (const id of m.jobs) {
      const r = running.get(id)!;
      r.paused = false;
      r.stopAt = undefined;
    }
    recomputeOccupancy();
    migrationSeconds.push(now - m.started);
    routesDirty = true;
  };

  const advance = (to: number) => {
    const dt = to - now;
    if (dt > 0) {
      for (const r of running.values()) if (!r.paused) r.progress += r.rate * dt;
      for (const m of migrations) for (const t of m.transfers) t.remaining -= t.rate * dt;
      fragmentation.maxIntegral += fragmentation.current.max * dt;
      fragmentation.totalIntegral += fragmentation.current.total * dt;
      fragmentation.groupsIntegral += fragmentation.current.groups * dt;
    }
    now = to;
  };

  const timeAverage = (integral: number) => (now > 0 ? integral / now : 0);

  while (nextArrival < jobs.length || running.size > 0 || queue.length > 0) {
    if (routesDirty) reroute();
    if (ratesDirty) rerate();
    let next = jobs[nextArrival]?.arrival ?? Infinity;
    for (const r of running.values()) {
      if (r.paused) continue;
      const target = r.stopAt ?? r.job.iterations;
      next = Math.min(next, now + Math.max(0, target - r.progress) / r.rate);
    }
    for (const m of migrations) {
      if (m.phase === "transfer") for (const t of m.transfers) next = Math.min(next, now + Math.max(0, t.remaining) / t.rate);
      if (m.phase === "restart") next = Math.min(next, m.restartEnds);
    }
    if (computing) next = Math.min(next, computing.ready);
    if (next === Infinity) throw new Error(`the simulation stalled at ${now} s with ${queue.length} jobs queued and ${running.size} running`);
    advance(Math.max(now, next));
    const due = (t: number) => t <= now + SAME_TIME * Math.max(1, now);

    let placementChanged = false;
    for (const r of [...running.values()]) {
      if (r.paused) continue;
      const target = r.stopAt ?? r.job.iterations;
      if (!due(now + Math.max(0, target - r.progress) / r.rate)) continue;
      r.progress = target;
      if (target >= r.job.iterations) {
        finishJob(r);
        placementChanged = true;
      } else {
        pause(r);
        beginTransfersIfReady();
      }
    }
    for (const m of [...migrations]) {
      if (m.phase !== "transfer") continue;
      m.transfers = m.transfers.filter((t) => !due(now + Math.max(0, t.remaining) / t.rate));
      if (m.transfers.length === 0) nextStep(m);
      else ratesDirty = true;
    }
    for (const m of [...migrations]) {
      if (m.phase !== "restart" || !due(m.restartEnds)) continue;
      endMigration(m);
      placementChanged = true;
    }
    while (nextArrival < jobs.length && due(jobs[nextArrival]!.arrival)) queue.push(jobs[nextArrival++]!);
    if (startQueued()) placementChanged = true;
    if (placementChanged) placements++;
    if (computing && due(computing.ready)) planArrived();
    else if (placementChanged) maybePlan();
  }

  return {
    system,
    jobs: outcomes,
    plans,
    migrationSeconds,
    bytesMoved,
    makespanSeconds: now,
    fragmentation: {
      peakMaxRack: fragmentation.peakMaxRack,
      meanMaxRack: timeAverage(fragmentation.maxIntegral),
      meanRack: timeAverage(fragmentation.totalIntegral) / racks,
      peakTotal: fragmentation.peakTotal,
      meanTotal: timeAverage(fragmentation.totalIntegral),
      meanFragmentedGroups: timeAverage(fragmentation.groupsIntegral),
    },
  };
}

/** One cross-rack sub-flow of a stage's all-to-all: host to host on one NIC. */
interface A2aFlow extends OtherFlow {
  readonly group: number;
}

function allToAllFlows(cluster: Cluster, hasAllToAll: (job: string) => boolean, nics: number, fabric: Fabric): A2aFlow[] {
  const flows: A2aFlow[] = [];
  cluster.groups.forEach((group, g) => {
    if (!hasAllToAll(group.job)) return;
    const hosts = cluster.placement[g]!;
    // A NIC sends to each of the stage's other hosts in turn: a 1/(n − 1) share of its speed.
    const share = 1 / Math.max(1, hosts.length - 1);
    for (const a of hosts) {
      for (const b of hosts) {
        const srcRack = fabric.rackOf(a);
        const dstRack = fabric.rackOf(b);
        if (srcRack === dstRack) continue;
        for (let k = 0; k < nics; k++) flows.push({ group: g, srcHost: a, dstHost: b, srcRack, dstRack, nic: k, key: `a2a/${group.job}/${group.index}/${a}>${b}/${k}`, share });
      }
    }
  });
  return flows;
}

/** The rate a job's pipeline flows want: what hides them behind compute, at most a NIC's speed. */
function ppDemand(job: SimJob, nic: number): number {
  return job.computeSeconds > 0 ? Math.min(nic, job.ppBytes / job.computeSeconds) : nic;
}

/** Crux's intensity: GPU-seconds a byte of the job's all-reduce holds up. */
function intensity(job: SimJob | undefined, nic: number): number {
  if (!job || job.ringBytes === 0) return 0;
  return (job.stages * job.hostsPerStage * (job.computeSeconds + job.ringBytes / nic)) / job.ringBytes;
}
