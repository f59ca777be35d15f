import { podOfRack, rackOf, type Cluster, type Placement } from "./cluster.ts";

/**
 * Fragmentation degree of every rack: the sum of `rings` over groups that have a host on the
 * rack and a host on another rack (paper §5.1, weighted by rings as in §5.3).
 */
export function rackFragmentation(cluster: Cluster, placement: Placement = cluster.placement): number[] {
  return fragmentation(cluster, placement, cluster.topology.racks, (host) => rackOf(cluster, host));
}

/** Fragmentation degree of every pod (MonkeyTree3); empty when the topology has no pods. */
export function podFragmentation(cluster: Cluster, placement: Placement = cluster.placement): number[] {
  return fragmentation(cluster, placement, cluster.podCount, (host) => podOfRack(cluster, rackOf(cluster, host)));
}

function fragmentation(cluster: Cluster, placement: Placement, domains: number, domainOf: (host: number) => number): number[] {
  const degree = new Array<number>(domains).fill(0);
  placement.forEach((hosts, g) => {
    const spanned = new Set(hosts.map(domainOf));
    if (spanned.size < 2) return;
    const rings = cluster.groups[g]?.rings ?? 0;
    for (const d of spanned) degree[d] = (degree[d] ?? 0) + rings;
  });
  return degree;
}

/** Racks (and pods) whose fragmentation degree exceeds the bound. */
export interface Violations {
  readonly racks: readonly number[];
  readonly pods: readonly number[];
}

export function violations(cluster: Cluster, placement: Placement = cluster.placement): Violations {
  const over = (degrees: number[], bound: number | undefined) =>
    bound === undefined ? [] : degrees.flatMap((d, i) => (d > bound ? [i] : []));
  return {
    racks: over(rackFragmentation(cluster, placement), cluster.lambda),
    pods: over(podFragmentation(cluster, placement), cluster.podLambda),
  };
}

export const withinBounds = (cluster: Cluster, placement: Placement = cluster.placement): boolean => {
  const v = violations(cluster, placement);
  return v.racks.length === 0 && v.pods.length === 0;
};
