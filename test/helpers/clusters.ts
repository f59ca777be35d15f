import { parseSnapshot, type Cluster, type Placement } from "../../controller/planner/model/index.ts";
import { Random } from "../../controller/simulator/random.ts";

/** A small random cluster: few racks and hosts so that a brute-force optimum is cheap. */
export function smallCluster(seed: number): Cluster {
  const random = new Random(seed);
  const racks = random.int(2, 4);
  const hostsPerRack = random.int(2, 4);
  const pods = racks === 4 && random.float() < 0.3;
  const hosts = Array.from({ length: racks * hostsPerRack }, (_, h) => h);
  for (let i = hosts.length - 1; i > 0; i--) {
    const j = random.int(0, i);
    [hosts[i], hosts[j]] = [hosts[j]!, hosts[i]!];
  }
  const used = random.int(Math.ceil(hosts.length / 2), hosts.length);
  const jobs: { id: string; rings: number; groups: number[][] }[] = [];
  let next = 0;
  while (next < used) {
    const stages = random.float() < 0.2 ? 2 : 1;
    const groups: number[][] = [];
    for (let s = 0; s < stages && next < used; s++) {
      const size = Math.min(random.int(1, hostsPerRack + 1), used - next);
      groups.push(hosts.slice(next, next + size));
      next += size;
    }
    jobs.push({ id: `j${jobs.length}`, rings: random.choice([1, 1, 2]), groups });
  }
  return parseSnapshot({
    topology: { racks, hostsPerRack, gpusPerHost: 8, uplinksPerRack: 4, ...(pods ? { racksPerPod: 2 } : {}) },
    lambda: random.int(0, 3),
    ...(pods ? { podLambda: random.int(1, 3) } : {}),
    jobs: jobs.map((job) => ({ id: job.id, rings: job.rings, groups: job.groups })),
  });
}

/**
 * The fewest moves to any placement within bounds, by enumerating every distribution of every
 * group over the racks (rack capacity respected); Infinity when none exists. Independent of
 * the planner: it recomputes fragmentation from scratch for each candidate.
 */
export function bruteForceMoves(cluster: Cluster): number {
  const { racks, hostsPerRack } = cluster.topology;
  const initial = cluster.placement.map((hosts) => {
    const counts = new Array<number>(racks).fill(0);
    for (const h of hosts) counts[Math.floor(h / hostsPerRack)]! += 1;
    return counts;
  });
  const rings = cluster.groups.map((g) => g.rings);
  const podOf = (t: number) => (cluster.topology.racksPerPod ? Math.floor(t / cluster.topology.racksPerPod) : 0);
  const valid = (dist: number[][]) => {
    const rack = new Array<number>(racks).fill(0);
    const pod = new Array<number>(racks).fill(0);
    dist.forEach((counts, g) => {
      const on = counts.flatMap((c, t) => (c > 0 ? [t] : []));
      if (on.length > 1) for (const t of on) rack[t]! += rings[g]!;
      const pods = [...new Set(on.map(podOf))];
      if (pods.length > 1) for (const p of pods) pod[p]! += rings[g]!;
    });
    return rack.every((d) => d <= cluster.lambda) && (cluster.podLambda === undefined || pod.every((d) => d <= cluster.podLambda!));
  };
  let best = Number.POSITIVE_INFINITY;
  const free = new Array<number>(racks).fill(hostsPerRack);
  const dist: number[][] = [];
  const place = (g: number, moved: number) => {
    if (moved >= best) return;
    if (g === initial.length) {
      if (valid(dist)) best = moved;
      return;
    }
    const size = initial[g]!.reduce((a, b) => a + b, 0);
    const counts = new Array<number>(racks).fill(0);
    const spread = (t: number, left: number) => {
      if (t === racks - 1) {
        if (left > free[t]!) return;
        counts[t] = left;
      } else {
        for (let c = Math.min(left, free[t]!); c >= 0; c--) {
          counts[t] = c;
          spread(t + 1, left - c);
        }
        return;
      }
      const cost = counts.reduce((sum, c, u) => sum + Math.max(0, initial[g]![u]! - c), 0);
      counts.forEach((c, u) => (free[u]! -= c));
      dist.push([...counts]);
      place(g + 1, moved + cost);
      dist.pop();
      counts.forEach((c, u) => (free[u]! += c));
    };
    spread(0, size);
  };
  place(0, 0);
  return best;
}

export function hostsOf(placement: Placement): number[] {
  return placement.flat().sort((a, b) => a - b);
}
