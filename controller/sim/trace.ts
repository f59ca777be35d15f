import { z } from "zod";
import { clusterFromSnapshot, parseSnapshot, toSnapshot, type Cluster, type Placement } from "../model/cluster.ts";
import { InvalidInputError } from "../../sdk/errors.ts";
import { podFragmentation, rackFragmentation } from "../model/fragmentation.ts";
import { TopologySchema, type Snapshot } from "../model/snapshot.ts";
import { Random } from "./random.ts";
import { scheduler, SCHEDULERS } from "./scheduler.ts";
import { MIXES, workload, type JobSpec } from "./workload.ts";

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

interface RunningJob {
  readonly spec: JobSpec;
  readonly ends: number;
  groups: number[][];
}

/** Jobs last one mean duration; time is measured in it. */
const MEAN_DURATION = 1;

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
  const options = parsed.data;
  const { topology } = options;
  const hostCount = topology.racks * topology.hostsPerRack;
  const lambda = options.lambda ?? topology.uplinksPerRack;
  const { podLambda } = options;
  // Surface a bad topology/bound combination (podLambda without pods) before simulating.
  parseSnapshot(snapshotOf([]), "trace options");

  const random = new Random(options.seed);
  // Its own stream, so that every front-end sees the same arrivals and durations.
  const place = scheduler(options.scheduler, new Random(options.seed + 1));
  const jobs = workload(options.mix, hostCount);
  const arrivalRate = (options.load * hostCount) / (jobs.meanHosts * MEAN_DURATION);
  const warmup = options.warmup ?? Math.ceil(3 * arrivalRate * MEAN_DURATION);

  const occupied = new Array<boolean>(hostCount).fill(false);
  let running: RunningJob[] = [];
  const queue: JobSpec[] = [];
  let now = 0;
  let nextArrival = random.exponential(arrivalRate);
  let arrivals = 0;
  let turnedAway = 0;
  let departures = 0;
  let events = 0;
  let busy = 0;
  let measuredSince: number | undefined = warmup === 0 ? 0 : undefined;
  let busyTime = 0;

  const summary = (): TraceSummary => {
    const measuredTime = measuredSince === undefined ? 0 : now - measuredSince;
    return {
      arrivals,
      turnedAway,
      departures,
      events,
      measuredTime,
      load: measuredTime > 0 ? busyTime / (measuredTime * hostCount) : 0,
      queued: queue.length,
    };
  };
  const advance = (to: number) => {
    if (measuredSince !== undefined) busyTime += busy * (to - now);
    now = to;
  };
  const occupy = (groups: readonly (readonly number[])[], value: boolean) => {
    for (const hosts of groups) for (const h of hosts) occupied[h] = value;
    busy += (value ? 1 : -1) * groups.reduce((sum, hosts) => sum + hosts.length, 0);
  };

  function snapshotOf(jobList: readonly { spec: JobSpec; groups: readonly (readonly number[])[] }[]): Snapshot {
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
  const breaksBound = (job: RunningJob): boolean => {
    const before = clusterFromSnapshot(snapshotOf(running));
    const after = clusterFromSnapshot(snapshotOf([...running, job]));
    const rises = (was: number[], is: number[], bound: number | undefined) =>
      bound !== undefined && is.some((degree, d) => degree > bound && degree > (was[d] ?? 0));
    return (
      rises(rackFragmentation(before), rackFragmentation(after), lambda) ||
      rises(podFragmentation(before), podFragmentation(after), podLambda)
    );
  };

  /** Replaces every running job's hosts with the reply's; the reply must move hosts only. */
  const adopt = (cluster: Cluster, placement: Placement) => {
    if (placement.length !== cluster.placement.length) {
      throw new InvalidInputError("placement", [
        { path: "", message: `expected ${cluster.placement.length} groups, received ${placement.length}` },
      ]);
    }
    parseSnapshot(toSnapshot(cluster, placement), "placement");
    const byId = new Map(running.map((job) => [job.spec.id, job]));
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
    occupied.fill(false);
    busy = 0;
    for (const job of running) occupy(job.groups, true);
  };

  while (events < options.events && (options.maxArrivals === undefined || arrivals < options.maxArrivals)) {
    const leaving = firstToEnd(running);
    if (leaving && leaving.ends <= nextArrival) {
      advance(leaving.ends);
      running = running.filter((job) => job !== leaving);
      occupy(leaving.groups, false);
      departures++;
    } else {
      advance(nextArrival);
      queue.push(jobs.draw(random, arrivals));
      arrivals++;
      if (arrivals === warmup) measuredSince = now;
      nextArrival = now + random.exponential(arrivalRate);
    }
    // FIFO: the head of the queue blocks everything behind it until enough hosts are free.
    for (let head = queue[0]; head !== undefined && events < options.events; head = queue[0]) {
      const groups = place(occupied, topology.hostsPerRack, new Array<number>(head.stages).fill(head.hostsPerStage));
      if (!groups) break;
      queue.shift();
      const job: RunningJob = { spec: head, ends: now + random.exponential(1 / MEAN_DURATION), groups };
      const violates = breaksBound(job);
      if (violates && arrivals < warmup) {
        turnedAway++;
        continue;
      }
      running.push(job);
      occupy(groups, true);
      if (!violates) continue;
      events++;
      const cluster = parseSnapshot(snapshotOf(running), "trace");
      const reply = yield cluster;
      if (reply !== undefined) adopt(cluster, reply);
    }
  }
  return summary();
}

/** The job that ends first; the earlier placed on a tie. */
function firstToEnd(running: readonly RunningJob[]): RunningJob | undefined {
  let first: RunningJob | undefined;
  for (const job of running) if (!first || job.ends < first.ends) first = job;
  return first;
}
