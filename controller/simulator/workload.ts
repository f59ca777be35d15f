import type { Random } from "./random.ts";

/**
 * Job mixes for traces, after the paper's simulator (§6.1, Table 1): jobs are drawn at random,
 * then their parallelism and its degrees. Sizes are in hosts, the unit of placement.
 */
export const MIXES = ["dp", "tp8pp"] as const;
/** `dp`: DP/FSDP jobs only. `tp8pp`: TP=8 jobs with 2–4 pipeline stages, mixed with DP/FSDP jobs. */
export type Mix = (typeof MIXES)[number];

/** The shape of a job, without its identity. */
export interface JobShape {
  /** Cross-rack DP rings per fragmented rack: the TP degree, 1 for DP/FSDP. */
  readonly rings: number;
  /** Pipeline stages; each is its own group. 1 for DP/FSDP. */
  readonly stages: number;
  /** DP degree in hosts of every stage (stages are equal in size). */
  readonly hostsPerStage: number;
}

/** One job of a trace. */
export interface JobSpec extends JobShape {
  /** `<model>-<n>`, `n` counting arrivals, as in the example snapshots. */
  readonly id: string;
}

/** A job mix sized for one cluster: every shape with its probability, and the expected size. */
export interface Workload {
  readonly shapes: readonly (readonly [shape: JobShape, probability: number])[];
  /** Expected hosts per job; with the mean duration it sets the arrival rate for a target load. */
  readonly meanHosts: number;
  /** The `n`-th job of a trace. */
  draw(random: Random, n: number): JobSpec;
}

const DP_MODELS = ["gpt3-7b", "gpt3-13b", "gpt-oss-20b", "gpt-oss-120b"] as const;
const TP_MODELS = ["llama2-70b", "llama3-70b"] as const;

/** DP/FSDP sizes like the example traces: mostly 4–16 hosts. */
const DP_SIZES: readonly (readonly [hosts: number, weight: number])[] = [
  [1, 10],
  [2, 15],
  [4, 25],
  [8, 25],
  [16, 17],
];
/** Weight shared by the occasional larger jobs, powers of two from 32 hosts up to the size cap. */
const LARGE_DP_WEIGHT = 8;
const PP_STAGES = [2, 3, 4] as const;
const STAGE_HOSTS: readonly (readonly [hosts: number, weight: number])[] = [
  [1, 15],
  [2, 35],
  [4, 30],
  [8, 20],
];
/** Share of TP jobs in the `tp8pp` mix (8 of 13 jobs in the example snapshot). */
const TP_SHARE = 0.5;
const TP_RINGS = 8;

/**
 * The mix for a cluster of `hostCount` hosts. No job takes more than a quarter of the cluster,
 * so that the FIFO queue in front of the scheduler drains at high load.
 */
export function workload(mix: Mix, hostCount: number): Workload {
  const cap = Math.max(1, Math.floor(hostCount / 4));
  const dp = normalise(dpShapes(cap));
  const shapes = mix === "dp" ? dp : [...scale(dp, 1 - TP_SHARE), ...scale(normalise(tpShapes(cap)), TP_SHARE)];
  const meanHosts = shapes.reduce((sum, [shape, p]) => sum + p * shape.stages * shape.hostsPerStage, 0);
  return {
    shapes,
    meanHosts,
    draw(random, n) {
      const shape = random.weighted(shapes);
      const model = random.choice(shape.rings === 1 ? DP_MODELS : TP_MODELS);
      return { id: `${model}-${n}`, ...shape };
    },
  };
}

function dpShapes(cap: number): [JobShape, number][] {
  const sizes = DP_SIZES.filter(([hosts]) => hosts <= cap);
  const large: number[] = [];
  for (let hosts = 32; hosts <= cap; hosts *= 2) large.push(hosts);
  const entries = [...sizes, ...large.map((hosts) => [hosts, LARGE_DP_WEIGHT / large.length] as const)];
  return entries.map(([hosts, weight]) => [{ rings: 1, stages: 1, hostsPerStage: hosts }, weight]);
}

function tpShapes(cap: number): [JobShape, number][] {
  const shapes: [JobShape, number][] = [];
  for (const stages of PP_STAGES) {
    for (const [hosts, weight] of STAGE_HOSTS) {
      if (stages * hosts <= cap) shapes.push([{ rings: TP_RINGS, stages, hostsPerStage: hosts }, weight]);
    }
  }
  if (shapes.length === 0) throw new RangeError("the tp8pp mix needs a cluster of at least 8 hosts");
  return shapes;
}

function normalise(entries: [JobShape, number][]): [JobShape, number][] {
  const total = entries.reduce((sum, [, w]) => sum + w, 0);
  return entries.map(([shape, w]) => [shape, w / total]);
}

function scale(entries: [JobShape, number][], factor: number): [JobShape, number][] {
  return entries.map(([shape, p]) => [shape, p * factor]);
}
