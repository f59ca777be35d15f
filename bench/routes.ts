// Perfect-routing benchmark: colouring every DP flow of a cluster with exactly Δ colours, our
// alternating-path colouring against the paper's Δ rounds of Hopcroft–Karp on the graph padded
// to Δ-regular, on the same graphs in the same run. Also times the whole `routeCluster`
// (ring orders, flows, colouring, PP round-robin, source-port search), and the same in a
// 3-tier Clos (pods of 16 racks, pod bound 32), where inter-pod flows need three ECMP choices.
//
// Clusters are synthetic: racks of 8 hosts × 8 GPUs, 32 uplinks per rack, TP=8 jobs (8 rings
// each), groups dropped on random racks while every rack stays within λ = 32, 95% full.
//
//   npm run bench:routes -- --sizes 1024,8192 --reps 30
import { checked, helpText, int, parseCommandFlags } from "../cli/flags.ts";
import { table, UsageError } from "../cli/io.ts";
import { benchMain } from "./entry.ts";
import type { Cluster } from "../controller/planner/model/cluster.ts";
import {
  colourByRegularMatchings,
  colourEdges,
  dpFlows,
  isProperColouring,
  ringOrders,
  routeCluster,
  type BipartiteMultigraph,
  type ColourMethod,
} from "../controller/planner/route/index.ts";
import { syntheticCluster } from "../controller/simulator/synthetic.ts";

const HOSTS_PER_RACK = 8;
const GPUS_PER_RACK = HOSTS_PER_RACK * 8;
const UPLINKS = 32;
const RINGS = 8;

function clusterSizes(raw: string): number[] {
  return raw.split(",").map((item) => {
    const gpus = Number(item);
    if (!Number.isInteger(gpus) || gpus <= 0 || gpus % GPUS_PER_RACK !== 0) {
      throw new UsageError(`--sizes takes multiples of ${GPUS_PER_RACK} GPUs, got "${item}"`);
    }
    return gpus;
  });
}

const FLAGS = {
  sizes: checked("LIST", `GPU counts, multiples of ${GPUS_PER_RACK}`, clusterSizes, { default: "1024,2048,4096,8192" }),
  clusters: int("N", "random clusters per size", { default: 5, min: 1 }),
  reps: int("N", "timed colourings per cluster and method", { default: 20, min: 1 }),
  seed: int("N", "first cluster seed", { default: 1, min: 0 }),
  "pod-reps": int("N", "timed 3-tier routings per cluster, 0 to skip them", { default: 3, min: 0 }),
};

const help = helpText({
  command: "npm run bench:routes --",
  table: FLAGS,
  about: `Colours the DP flows of synthetic clusters (${HOSTS_PER_RACK}×8 GPUs per rack, ${UPLINKS} uplinks, TP=${RINGS}, λ=${UPLINKS})
with alternating paths and with padded-regular Hopcroft–Karp, and times the whole routing.`,
});

function options(argv: string[]) {
  const flags = parseCommandFlags(argv, FLAGS);
  return { sizes: flags.sizes, clusters: flags.clusters, reps: flags.reps, seed: flags.seed, podReps: flags["pod-reps"] };
}

function quantile(sorted: readonly number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN;
}

function time(work: () => unknown): number {
  const start = performance.now();
  work();
  return performance.now() - start;
}

function dpGraph(cluster: Cluster): BipartiteMultigraph {
  const flows = dpFlows(cluster, ringOrders(cluster));
  const racks = cluster.topology.racks;
  return { left: racks, right: racks, from: flows.map((f) => f.srcRack), to: flows.map((f) => f.dstRack) };
}

interface Row {
  readonly gpus: number;
  readonly flows: number;
  readonly delta: number;
  readonly ours: number[];
  readonly paper: number[];
  readonly whole: number[];
}

type Options = ReturnType<typeof options>;

const shape = (gpus: number) => ({
  racks: gpus / GPUS_PER_RACK,
  hostsPerRack: HOSTS_PER_RACK,
  uplinksPerRack: UPLINKS,
  rings: RINGS,
  fill: 0.95,
  maxSpan: 8,
  pipelineShare: 0.2,
});

function measure(gpus: number, opts: Options): Row {
  const row = { ours: [] as number[], paper: [] as number[], whole: [] as number[] };
  let flows = 0;
  let delta = 0;
  for (let c = 0; c < opts.clusters; c++) {
    const cluster = syntheticCluster(shape(gpus), opts.seed + c);
    const graph = dpGraph(cluster);
    const methods: [ColourMethod, number[]][] = [
      [colourEdges, row.ours],
      [colourByRegularMatchings, row.paper],
    ];
    for (const [colour] of methods) {
      const colouring = colour(graph);
      if (!isProperColouring(graph, colouring)) throw new Error(`improper colouring at ${gpus} GPUs, cluster ${c}`);
      delta = Math.max(delta, colouring.count);
    }
    flows += graph.from.length;
    for (let r = 0; r < opts.reps; r++) {
      // Alternate the order so neither method always runs on warmer caches.
      const order = r % 2 === 0 ? methods : [...methods].reverse();
      for (const [colour, samples] of order) samples.push(time(() => colour(graph)));
      row.whole.push(time(() => routeCluster(cluster)));
    }
  }
  return { gpus, flows: Math.round(flows / opts.clusters), delta, ...row };
}

interface PodRow {
  readonly gpus: number;
  readonly dp: number;
  readonly interPod: number;
  readonly unsteered: number;
  readonly isolated: boolean;
  readonly whole: number[];
}

const RACKS_PER_POD = 16;
const POD_LAMBDA = 32;

function measurePods(gpus: number, opts: Options): PodRow {
  const row = { gpus, dp: 0, interPod: 0, unsteered: 0, isolated: true, whole: [] as number[] };
  for (let c = 0; c < opts.clusters; c++) {
    const racksPerPod = Math.min(RACKS_PER_POD, gpus / GPUS_PER_RACK);
    const cluster = syntheticCluster({ ...shape(gpus), racksPerPod, podLambda: POD_LAMBDA }, opts.seed + c);
    const routes = routeCluster(cluster);
    row.dp += routes.dpFlows.length;
    row.interPod += routes.dpFlows.filter((f) => f.core !== null).length;
    row.unsteered += routes.unsteered;
    row.isolated &&= routes.isolated;
    for (let r = 0; r < opts.podReps; r++) row.whole.push(time(() => routeCluster(cluster)));
  }
  return { ...row, dp: Math.round(row.dp / opts.clusters), interPod: Math.round(row.interPod / opts.clusters) };
}

function main(opts: Options): number {
  // Warm the JIT on a small cluster so the first size is not charged for compilation.
  measure(GPUS_PER_RACK * 8, { ...opts, clusters: 2, reps: 10 });
  const rows = opts.sizes.map((gpus) => measure(gpus, opts));
  const ms = (samples: number[], q: number) =>
    quantile(
      [...samples].sort((a, b) => a - b),
      q,
    ).toFixed(3);
  process.stdout.write(
    `${table(
      ["GPUs", "racks", "DP flows", "Δ", "ours p50 ms", "ours p90 ms", "HK p50 ms", "HK p90 ms", "HK/ours p50", "routeCluster p50 ms"],
      rows.map((r) => {
        const p50 = (s: number[]) =>
          quantile(
            [...s].sort((a, b) => a - b),
            0.5,
          );
        return [
          r.gpus,
          r.gpus / GPUS_PER_RACK,
          r.flows,
          r.delta,
          ms(r.ours, 0.5),
          ms(r.ours, 0.9),
          ms(r.paper, 0.5),
          ms(r.paper, 0.9),
          `${(p50(r.paper) / p50(r.ours)).toFixed(1)}×`,
          ms(r.whole, 0.5),
        ];
      }),
    )}\n`,
  );
  process.stdout.write(`${opts.clusters} clusters per size × ${opts.reps} timed runs per method; Δ is the largest seen.\n`);
  if (opts.podReps === 0) return 0;
  const pods = opts.sizes.map((gpus) => measurePods(gpus, opts));
  process.stdout.write(
    `\n3-tier Clos, pods of ${RACKS_PER_POD} racks, pod bound ${POD_LAMBDA}, ${UPLINKS} aggregation and ${UPLINKS} core switches:\n${table(
      ["GPUs", "DP flows", "inter-pod", "unsteered (all runs)", "isolated", "routeCluster p50 ms", "p90 ms"],
      pods.map((r) => [r.gpus, r.dp, r.interPod, r.unsteered, r.isolated ? "yes" : "no", ms(r.whole, 0.5), ms(r.whole, 0.9)]),
    )}\n`,
  );
  return 0;
}

await benchMain("routes", help, options, main);
