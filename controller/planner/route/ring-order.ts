import { podOfRack, rackOf, type Cluster, type Placement } from "../model/cluster.ts";

/**
 * The host order of each group's DP ring(s). Ordered rack by rack (and, in a 3-tier Clos, pod
 * by pod), a ring crosses each rack boundary exactly once in each direction of travel, so a
 * rack's DP flows equal its fragmentation degree.
 *
 * Orders are stable because they are rank assignments: reordering a running job's ring means
 * re-forming its process group. Given the previous orders, a group with the same hosts keeps
 * its order exactly (when that order is already contiguous); a changed group keeps its
 * surviving hosts in their previous relative order, except where contiguity forces a rack's
 * survivors together, and new hosts join their rack's block (new racks go last), in host order.
 */
export function ringOrders(cluster: Cluster, previous?: Placement): number[][] {
  return cluster.placement.map((hosts, g) => ringOrder(cluster, hosts, previous?.[g]));
}

export function ringOrder(cluster: Cluster, hosts: readonly number[], previous: readonly number[] = []): number[] {
  const members = new Set(hosts);
  const survivors = previous.filter((h) => members.has(h));
  const kept = new Set(survivors);
  const newcomers = hosts.filter((h) => !kept.has(h)).sort((a, b) => a - b);
  const sequence = [...survivors, ...newcomers];

  // Each pod and rack ranks by the first position one of its hosts holds in `sequence`.
  const podRank = new Map<number, number>();
  const rackRank = new Map<number, number>();
  sequence.forEach((host, i) => {
    const rack = rackOf(cluster, host);
    const pod = podOfRack(cluster, rack);
    if (!podRank.has(pod)) podRank.set(pod, i);
    if (!rackRank.has(rack)) rackRank.set(rack, i);
  });
  const keyed = sequence.map((host, position) => {
    const rack = rackOf(cluster, host);
    return { host, pod: podRank.get(podOfRack(cluster, rack)) ?? 0, rack: rackRank.get(rack) ?? 0, position };
  });
  keyed.sort((a, b) => a.pod - b.pod || a.rack - b.rack || a.position - b.position);
  return keyed.map((k) => k.host);
}

/** True when every rack's (and pod's) hosts sit next to each other in `order`. */
export function isContiguous(cluster: Cluster, order: readonly number[]): boolean {
  const runs = (domainOf: (host: number) => number): boolean => {
    const closed = new Set<number>();
    let current: number | undefined;
    for (const host of order) {
      const d = domainOf(host);
      if (d === current) continue;
      if (closed.has(d)) return false;
      if (current !== undefined) closed.add(current);
      current = d;
    }
    return true;
  };
  return runs((h) => rackOf(cluster, h)) && runs((h) => podOfRack(cluster, rackOf(cluster, h)));
}
