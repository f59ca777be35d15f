import { rackOf, type Cluster, type Placement } from "../model/cluster.ts";

/** One cross-rack hop of one DP ring: from the last host of a rack's block to the next block's first. */
export interface DpFlow {
  readonly group: number;
  readonly ring: number;
  readonly srcHost: number;
  readonly dstHost: number;
  readonly srcRack: number;
  readonly dstRack: number;
}

/**
 * Pipeline traffic between consecutive stages of one job: replica `replica` of stage
 * `fromGroup` sends activations to the same replica of the next stage (forward) and receives
 * gradients back (backward, `fromGroup` being the later stage).
 */
export interface PpFlow {
  readonly fromGroup: number;
  readonly toGroup: number;
  readonly replica: number;
  readonly srcHost: number;
  readonly dstHost: number;
  readonly srcRack: number;
  readonly dstRack: number;
}

/**
 * DP flows of every group that spans racks, in group, ring, ring-position order. Each of a
 * group's `rings` rings visits the rack blocks of `orders[g]` in turn and closes back to the
 * first, so a group on k ≥ 2 racks adds k flows per ring (for k = 2: there and back).
 */
export function dpFlows(cluster: Cluster, orders: Placement): DpFlow[] {
  const flows: DpFlow[] = [];
  cluster.groups.forEach((group, g) => {
    const blocks = rackBlocks(cluster, orders[g] ?? []);
    if (blocks.length < 2) return;
    for (let ring = 0; ring < group.rings; ring++) {
      blocks.forEach((src, i) => {
        const dst = blocks[(i + 1) % blocks.length]!;
        flows.push({ group: g, ring, srcHost: src.last, dstHost: dst.first, srcRack: src.rack, dstRack: dst.rack });
      });
    }
  });
  return flows;
}

/**
 * Cross-rack PP flows: replica j of stage i pairs the j-th host of stage i's ring order with
 * the j-th host of stage i+1's (cycling the shorter stage), in both directions.
 */
export function ppFlows(cluster: Cluster, orders: Placement): PpFlow[] {
  const stages = new Map<string, number[]>();
  cluster.groups.forEach((group, g) => {
    const list = stages.get(group.job) ?? [];
    list[group.index] = g;
    stages.set(group.job, list);
  });
  const flows: PpFlow[] = [];
  for (const list of stages.values()) {
    for (let i = 0; i + 1 < list.length; i++) {
      const a = list[i];
      const b = list[i + 1];
      if (a === undefined || b === undefined) continue;
      const hostsA = orders[a] ?? [];
      const hostsB = orders[b] ?? [];
      const replicas = Math.max(hostsA.length, hostsB.length);
      for (let replica = 0; replica < replicas; replica++) {
        const x = hostsA[replica % hostsA.length];
        const y = hostsB[replica % hostsB.length];
        if (x === undefined || y === undefined) continue;
        const rx = rackOf(cluster, x);
        const ry = rackOf(cluster, y);
        if (rx === ry) continue;
        flows.push({ fromGroup: a, toGroup: b, replica, srcHost: x, dstHost: y, srcRack: rx, dstRack: ry });
        flows.push({ fromGroup: b, toGroup: a, replica, srcHost: y, dstHost: x, srcRack: ry, dstRack: rx });
      }
    }
  }
  return flows;
}

interface RackBlock {
  readonly rack: number;
  readonly first: number;
  readonly last: number;
}

/** Maximal runs of one rack in a ring order; a rack split across runs appears once per run. */
function rackBlocks(cluster: Cluster, order: readonly number[]): RackBlock[] {
  const blocks: { rack: number; first: number; last: number }[] = [];
  for (const host of order) {
    const rack = rackOf(cluster, host);
    const top = blocks[blocks.length - 1];
    if (top && top.rack === rack) top.last = host;
    else blocks.push({ rack, first: host, last: host });
  }
  const head = blocks[0];
  const tail = blocks[blocks.length - 1];
  // The ring closes: a rack at both ends of the order is one block crossing the wrap.
  if (blocks.length > 1 && head && tail && head.rack === tail.rack) {
    head.first = tail.first;
    blocks.pop();
  }
  return blocks;
}
