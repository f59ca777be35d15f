import { z } from "zod";
import { clusterFromSnapshot, parseSnapshot, toSnapshot, type Cluster, type Placement } from "../planner/model/cluster.ts";
import { InvalidInputError } from "../../sdk/contract/errors.ts";
import { podFragmentation, rackFragmentation } from "../planner/model/fragmentation.ts";
import { TopologySchema, type Snapshot } from "../planner/model/snapshot.ts";
import { Random } from "./random.ts";
import { scheduler, SCHEDULERS, type Scheduler } from "./scheduler.ts";
import { MIXES, workload, type JobSpec, type Workload } from "./workload.ts";

export const TraceOptionsSchema = z.strictObject({
  seed: z.int(),
  topology: TopologySchema,
  /** Per-rack bound; defaults to `topology.uplinksPerRack`. */
  lambda: z.int().min(0).optional(),
  /** Per-pod bound; needs `topology.racksPerPod`. */
  podLambda: z.int().min(0).optional(),
  mix: z.enum(MIXES),
  /** The front-end that places arrivals; the paper's planner sits behind best-fit. */
  scheduler: z.enum(SCHEDULERS).default("best-fit"),
  /** Offered load: expected fraction of hosts busy in steady state. */
  load: z.number().gt(0).max(1).default(0.9),
  /**
   * Arrivals before the first yield. No planner runs meanwhile, so a job whose placement would
   * break a bound is turned away instead of placed: the cluster fills up to steady state and
   * still holds only placements a controller would have kept. Defaults to three mean job
   * lifetimes' worth of arrivals, by which an empty cluster is within 5% of its steady load.
   */
  warmup: z.int().min(0).optional(),
  /** Violation events to yield before the trace ends. */
  events: z.int().min(0),
  /** Ends the trace after this many arrivals even if fewer events came. */
  maxArrivals: z.int().min(0).optional(),
});
export type TraceOptions = z.input<typeof TraceOptionsSchema>;
type ParsedTraceOptions = z.infer<typeof TraceOptionsSchema>;

/** What a finished trace did; returned by the generator. */
export interface TraceSummary {
  readonly arrivals: number;
  /** Warm-up arrivals that were turned away because they would have broken a bound. */
  readonly turnedAway: number;
  readonly departures: number;
  /** Clusters yielded. */
  readonly events: number;
  /** Simulated time after warm-up, in mean job durations. */
  readonly measuredTime: number;
  /** Time-averaged fraction of hosts busy after warm-up. */
  readonly load: number;
  /** Jobs waiting in the FIFO queue when the trace ended. */
  readonly queued: number;
}

export interface RunningJob {
  readonly spec: JobSpec;
  readonly ends: number;
  groups: number[][];
}

/** Jobs last one mean duration; time is measured in it. */
const MEAN_DURATION = 1;

/** What every snapshot of a trace shares: topology and bounds. */
type TraceShape = Readonly<Pick<ParsedTraceOptions, "topology" | "podLambda">> & { readonly lambda: number };

/**
 * Everything a trace carries from event to event. The first block is fixed when it starts;
 * the rest changes as jobs arrive, start and leave.
 */
export interface TraceState extends TraceShape {
  readonly options: ParsedTraceOptions;
  readonly hostCount: number;
  /** Draws arrivals and durations. */
  readonly random: Random;
  /** The front-end scheduler, on its own random stream. */
  readonly place: Scheduler;
  readonly jobs: Workload;
  readonly arrivalRate: number;
  /** Arrivals before measuring starts, during which bound-breaking jobs are turned away. */
  readonly warmup: number;

  readonly occupied: boolean[];
  running: RunningJob[];
  readonly queue: JobSpec[];
  now: number;
  nextArrival: number;
  arrivals: number;
  turnedAway: number;
  departures: number;
  events: number;
  /** Hosts busy now. */
  busy: number;
  measuredSince: number | undefined;
  /** Busy hosts integrated over the measured time. */
  busyTime: number;
}

/**
 * A cluster trace: Poisson arrivals of jobs from a mix, exponential durations, placed by a
 * front-end scheduler (best-fit unless told) behind a FIFO queue, at an offered load. Each
 * time a placement pushes a rack (or pod, with `podLambda`) above its bound, or further above
 * it, the trace yields the cluster at that moment and continues from the placement passed to
 * `next` (the planner's result), or from the violating one when `next` gets `undefined`.
 * Departures only lower fragmentation, so they never yield.
 *
 * Pure and deterministic: the same options give the same clusters for the same replies.
 */
export function* trace(input: TraceOptions): Generator<Cluster, TraceSummary, Placement | undefined> {
  const parsed = TraceOptionsSchema.safeParse(input);
  if (!parsed.success) throw InvalidInputError.fromZod("trace options", parsed.error);
  const state = createTraceState(parsed.data);
  while (tracing(state)) {
    departOrArrive(state);
    yield* startQueued(state);
  }
  return traceSummary(state);
}

/** The trace before its first arrival: an empty cluster, the first arrival drawn. */
export function createTraceState(options: ParsedTraceOptions): TraceState {
  const { topology, podLambda } = options;
  const hostCount = topology.racks * topology.hostsPerRack;
  const lambda = options.lambda ?? topology.uplinksPerRack;
  // Surface a bad topology/bound combination (podLambda without pods) before simulating.
  parseSnapshot(snapshotOf({ topology, lambda, podLambda }, []), "trace options");

  const random = new Random(options.seed);
  // Its own stream, so that every front-end sees the same arrivals and durations.
  const place = scheduler(options.scheduler, new Random(options.seed + 1));
  const jobs = workload(options.mix, hostCount);
  const arrivalRate = (options.load * hostCount) / (jobs.meanHosts * MEAN_DURATION);
  const warmup = options.warmup ?? Math.ceil(3 * arrivalRate * MEAN_DURATION);
  return {
    options,
    topology,
    lambda,
    podLambda,
    hostCount,
    random,
    place,
    jobs,
    arrivalRate,
    warmup,
    occupied: new Array<boolean>(hostCount).fill(false),
    running: [],
    queue: [],
    now: 0,
    nextArrival: random.exponential(arrivalRate),
    arrivals: 0,
    turnedAway: 0,
    departures: 0,
    events: 0,
    busy: 0,
    measuredSince: warmup === 0 ? 0 : undefined,
    busyTime: 0,
  };
}

/** Whether the trace goes on: fewer events than asked for, and arrivals left. */
export function tracing(state: TraceState): boolean {
  const { options } = state;
  return state.events < options.events && (options.maxArrivals === undefined || state.arrivals < options.maxArrivals);
}

/** The next event that is no placement: the first running job leaves, or the next job arrives and queues. */
export function departOrArrive(state: TraceState): void {
  const leaving = firstToEnd(state.running);
  if (leaving && leaving.ends <= state.nextArrival) {
    advance(state, leaving.ends);
    state.running = state.running.filter((job) => job !== leaving);
    occupy(state, leaving.groups, false);
    state.departures++;
  } else {
    advance(state, state.nextArrival);
    state.queue.push(state.jobs.draw(state.random, state.arrivals));
    state.arrivals++;
    if (state.arrivals === state.warmup) state.measuredSince = state.now;
    state.nextArrival = state.now + state.random.exponential(state.arrivalRate);
  }
}

/**
 * Starts queued jobs, FIFO: the head of the queue blocks everything behind it until enough
 * hosts are free. Yields the cluster whenever a start breaks a bound, and goes on from the
 * reply's placement.
 */
function* startQueued(state: TraceState): Generator<Cluster, void, Placement | undefined> {
  const { queue, topology } = state;
  for (let head = queue[0]; head !== undefined && state.events < state.options.events; head = queue[0]) {
    const groups = state.place(state.occupied, topology.hostsPerRack, new Array<number>(head.stages).fill(head.hostsPerStage));
    if (!groups) break;
    queue.shift();
    const violation = startJob(state, head, groups);
    if (!violation) continue;
    const reply = yield violation;
    if (reply !== undefined) adopt(state, violation, reply);
  }
}

/**
 * Starts a job the front-end placed on `groups`, and draws its duration. A job that breaks a
 * bound during warm-up is turned away instead; after warm-up it counts as an event, and the
 * cluster with it is returned. `undefined` when there is nothing to yield.
 */
export function startJob(state: TraceState, spec: JobSpec, groups: number[][]): Cluster | undefined {
  const job: RunningJob = { spec, ends: state.now + state.random.exponential(1 / MEAN_DURATION), groups };
  const violates = breaksBound(state, job);
  if (violates && state.arrivals < state.warmup) {
    state.turnedAway++;
    return undefined;
  }
  state.running.push(job);
  occupy(state, groups, true);
  if (!violates) return undefined;
  state.events++;
  return parseSnapshot(snapshotOf(state, state.running), "trace");
}

/** What the trace did so far. */
export function traceSummary(state: TraceState): TraceSummary {
  const { measuredSince, now } = state;
  const measuredTime = measuredSince === undefined ? 0 : now - measuredSince;
  return {
    arrivals: state.arrivals,
    turnedAway: state.turnedAway,
    departures: state.departures,
    events: state.events,
    measuredTime,
    load: measuredTime > 0 ? state.busyTime / (measuredTime * state.hostCount) : 0,
    queued: state.queue.length,
  };
}

/** Moves the clock to `to`, counting busy hosts once measuring has started. */
function advance(state: TraceState, to: number): void {
  if (state.measuredSince !== undefined) state.busyTime += state.busy * (to - state.now);
  state.now = to;
}

/** Marks hosts busy (`value` true) or free, and counts them. */
function occupy(state: TraceState, groups: readonly (readonly number[])[], value: boolean): void {
  for (const hosts of groups) for (const h of hosts) state.occupied[h] = value;
  state.busy += (value ? 1 : -1) * groups.reduce((sum, hosts) => sum + hosts.length, 0);
}

function snapshotOf(shape: TraceShape, jobList: readonly { spec: JobSpec; groups: readonly (readonly number[])[] }[]): Snapshot {
  const { topology, lambda, podLambda } = shape;
  return {
    topology,
    lambda,
    ...(podLambda === undefined ? {} : { podLambda }),
    jobs: jobList.map(({ spec, groups }) =>
      spec.stages === 1
        ? { id: spec.id, rings: spec.rings, hosts: [...(groups[0] ?? [])] }
        : { id: spec.id, rings: spec.rings, groups: groups.map((hosts) => [...hosts]) },
    ),
  };
}

/** Whether adding `job` raises some rack or pod above its bound, or further above it. */
export function breaksBound(state: TraceState, job: RunningJob): boolean {
  const before = clusterFromSnapshot(snapshotOf(state, state.running));
  const after = clusterFromSnapshot(snapshotOf(state, [...state.running, job]));
  const rises = (was: number[], is: number[], bound: number | undefined) =>
    bound !== undefined && is.some((degree, d) => degree > bound && degree > (was[d] ?? 0));
  return rises(rackFragmentation(before), rackFragmentation(after), state.lambda) || rises(podFragmentation(before), podFragmentation(after), state.podLambda);
}

/** Replaces every running job's hosts with the reply's; the reply must move hosts only. */
export function adopt(state: TraceState, cluster: Cluster, placement: Placement): void {
  if (placement.length !== cluster.placement.length) {
    throw new InvalidInputError("placement", [{ path: "", message: `expected ${cluster.placement.length} groups, received ${placement.length}` }]);
  }
  parseSnapshot(toSnapshot(cluster, placement), "placement");
  const byId = new Map(state.running.map((job) => [job.spec.id, job]));
  cluster.groups.forEach((group, g) => {
    const hosts = placement[g] ?? [];
    const job = byId.get(group.job);
    if (!job || hosts.length !== job.spec.hostsPerStage) {
      throw new InvalidInputError("placement", [
        { path: `[${g}]`, message: `expected ${job?.spec.hostsPerStage ?? 0} hosts for ${group.job} group ${group.index}, received ${hosts.length}` },
      ]);
    }
    job.groups[group.index] = [...hosts];
  });
  state.occupied.fill(false);
  state.busy = 0;
  for (const job of state.running) occupy(state, job.groups, true);
}

/** The job that ends first; the earlier placed on a tie. */
function firstToEnd(running: readonly RunningJob[]): RunningJob | undefined {
  let first: RunningJob | undefined;
  for (const job of running) if (!first || job.ends < first.ends) first = job;
  return first;
}
