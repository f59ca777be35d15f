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

/** Against λ and pod λ, or against `bounds` (per rack and pod) when given. */
export function violations(cluster: Cluster, placement: Placement = cluster.placement, bounds?: Pick<Bounds, "racks" | "pods">): Violations {
  const over = (degrees: number[], bound: (i: number) => number | undefined) =>
    degrees.flatMap((d, i) => {
      const b = bound(i);
      return b !== undefined && d > b ? [i] : [];
    });
  return {
    racks: over(rackFragmentation(cluster, placement), (i) => (bounds ? bounds.racks[i] : cluster.lambda)),
    pods: over(podFragmentation(cluster, placement), (i) => (bounds ? bounds.pods[i] : cluster.podLambda)),
  };
}

export const withinBounds = (cluster: Cluster, placement: Placement = cluster.placement, bounds?: Pick<Bounds, "racks" | "pods">): boolean => {
  const v = violations(cluster, placement, bounds);
  return v.racks.length === 0 && v.pods.length === 0;
};

/**
 * The bound each rack and pod is planned to. Pinned jobs (`movable: false`) never move, so the
 * degree they give a domain on their own is a floor no plan can go below; where that floor is
 * over λ the domain is planned to the floor instead — every movable fragmented group off it —
 * and listed in `unreachable`. Linear in the snapshot's size.
 */
export interface Bounds {
  readonly racks: readonly number[];
  readonly pods: readonly number[];
  /** Degree the pinned jobs alone give each rack and pod. */
  readonly pinned: { readonly racks: readonly number[]; readonly pods: readonly number[] };
  /** Domains whose pinned floor is over λ, with that floor. */
  readonly unreachable: { readonly racks: readonly Floor[]; readonly pods: readonly Floor[] };
}

export interface Floor {
  readonly index: number;
  /** Degree the pinned jobs alone give the domain. */
  readonly pinned: number;
}

export function plannedBounds(cluster: Cluster): Bounds {
  const pinned = cluster.placement.map((hosts, g) => (cluster.groups[g]?.movable === false ? hosts : []));
  const raise = (floors: number[], bound: number | undefined) => ({
    bounds: floors.map((f) => Math.max(f, bound ?? Number.POSITIVE_INFINITY)),
    over: floors.flatMap((f, index) => (bound !== undefined && f > bound ? [{ index, pinned: f }] : [])),
  });
  const floors = { racks: rackFragmentation(cluster, pinned), pods: podFragmentation(cluster, pinned) };
  const racks = raise(floors.racks, cluster.lambda);
  const pods = raise(floors.pods, cluster.podLambda);
  return { racks: racks.bounds, pods: pods.bounds, pinned: floors, unreachable: { racks: racks.over, pods: pods.over } };
}
