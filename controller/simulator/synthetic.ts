import { parseSnapshot, type Cluster, type Snapshot } from "../planner/model/index.ts";
import { Random } from "./random.ts";

export interface SyntheticShape {
  readonly racks: number;
  readonly hostsPerRack: number;
  readonly uplinksPerRack: number;
  /** Rings (TP degree) of every job. */
  readonly rings: number;
  /** Rack bound; every rack stays within it. Defaults to `uplinksPerRack`. */
  readonly lambda?: number;
  readonly racksPerPod?: number;
  /** Pod bound, enforced while placing when set. */
  readonly podLambda?: number;
  /** Share of hosts to fill, in (0, 1]. */
  readonly fill?: number;
  /** Most racks one group may span. */
  readonly maxSpan?: number;
  /** Chance that a job has two pipeline stages. */
  readonly pipelineShare?: number;
}

/**
 * A random placement that meets its bounds: groups land on random racks, and a group that
 * would spread over a rack (or pod) without room in its fragmentation budget is redrawn.
 * Deterministic in the seed, so a failing case replays.
 */
export function syntheticCluster(shape: SyntheticShape, seed: number): Cluster {
  return parseSnapshot(syntheticSnapshot(shape, seed));
}

/**
 * The snapshot `syntheticCluster` validates; unvalidated, so a benchmark can build clusters
 * past the supported sizes (with `clusterFromSnapshot`) to show how costs scale.
 */
export function syntheticSnapshot(shape: SyntheticShape, seed: number): Snapshot {
  const random = new Random(seed);
  const { racks, hostsPerRack, rings } = shape;
  const lambda = shape.lambda ?? shape.uplinksPerRack;
  const perPod = shape.racksPerPod ?? racks;
  const podBudget = new Array<number>(racks / perPod).fill(shape.podLambda ?? Infinity);
  const rackBudget = new Array<number>(racks).fill(lambda);
  const free = Array.from({ length: racks }, (_, r) => Array.from({ length: hostsPerRack }, (_, i) => r * hostsPerRack + i));
  const target = Math.floor((shape.fill ?? 0.9) * racks * hostsPerRack);
  const maxSpan = shape.maxSpan ?? 4;
  let placed = 0;

  const placeGroup = (): number[] | undefined => {
    for (let attempt = 0; attempt < 50; attempt++) {
      const span = random.int(1, maxSpan);
      const open = free.flatMap((hosts, r) => (hosts.length > 0 && (span === 1 || rackBudget[r]! >= rings) ? [r] : []));
      if (open.length < span) continue;
      const chosen = new Set<number>();
      while (chosen.size < span) chosen.add(random.choice(open));
      const pods = new Set([...chosen].map((r) => Math.floor(r / perPod)));
      if (pods.size > 1 && [...pods].some((p) => podBudget[p]! < rings)) continue;
      const hosts = [...chosen].flatMap((r) => {
        const list = free[r]!;
        return list.splice(0, random.int(1, list.length));
      });
      if (span > 1) for (const r of chosen) rackBudget[r]! -= rings;
      if (pods.size > 1) for (const p of pods) podBudget[p]! -= rings;
      return hosts;
    }
    return undefined;
  };

  const jobs: { id: string; rings: number; groups: number[][] }[] = [];
  while (placed < target) {
    const stages = random.float() < (shape.pipelineShare ?? 0.2) ? 2 : 1;
    const groups: number[][] = [];
    for (let s = 0; s < stages; s++) {
      const hosts = placeGroup();
      if (hosts) groups.push(hosts);
    }
    if (groups.length === 0) break;
    placed += groups.reduce((n, g) => n + g.length, 0);
    jobs.push({ id: `job${jobs.length}`, rings, groups });
  }
  return {
    topology: {
      racks,
      hostsPerRack,
      gpusPerHost: 8,
      uplinksPerRack: shape.uplinksPerRack,
      ...(shape.racksPerPod ? { racksPerPod: shape.racksPerPod } : {}),
    },
    lambda,
    ...(shape.podLambda === undefined ? {} : { podLambda: shape.podLambda }),
    jobs,
  };
}
