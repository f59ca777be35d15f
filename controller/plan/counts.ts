import { podOfRack, rackOf, type Cluster, type Placement } from "../model/cluster.ts";

/**
 * Workers per (group, rack): the planner's view of a placement. Which host inside a rack a
 * worker sits on does not change any rack's or pod's fragmentation, so plans are searched over
 * these counts and turned into host moves only at the end.
 */
export type Counts = Int32Array;

export function countsOf(cluster: Cluster, placement: Placement = cluster.placement): Counts {
  const racks = cluster.topology.racks;
  const counts = new Int32Array(cluster.groups.length * racks);
  placement.forEach((hosts, g) => {
    for (const h of hosts) counts[g * racks + rackOf(cluster, h)]! += 1;
  });
  return counts;
}

/** Moves needed to go from `from` to `to`: workers that leave a rack, summed over groups and racks. */
export function moveDistance(from: Counts, to: Counts): number {
  let moves = 0;
  for (let i = 0; i < from.length; i++) moves += Math.max(0, from[i]! - to[i]!);
  return moves;
}

/**
 * Counts with incremental fragmentation, occupancy and bound-violation bookkeeping, so a
 * search can try a worker move and undo it in O(1) (plus O(racks) for the moved group's
 * largest rack share).
 */
export class CountState {
  readonly groups: number;
  readonly racks: number;
  readonly pods: number;
  readonly capacity: number;
  readonly lambda: number;
  readonly podLambda: number;
  readonly size: Int32Array;
  readonly rings: Int32Array;
  readonly podOf: Int32Array;
  readonly count: Int32Array;
  /** Racks each group occupies. */
  readonly spread: Int32Array;
  /** Largest number of a group's workers on one rack. */
  readonly largest: Int32Array;
  readonly frag: Int32Array;
  readonly occupancy: Int32Array;
  readonly podCount: Int32Array;
  readonly podSpread: Int32Array;
  readonly podFrag: Int32Array;
  overRacks = 0;
  overPods = 0;
  overCapacity = 0;

  constructor(cluster: Cluster, counts: Counts = countsOf(cluster)) {
    const { racks, hostsPerRack } = cluster.topology;
    this.groups = cluster.groups.length;
    this.racks = racks;
    this.pods = cluster.podLambda === undefined ? 0 : cluster.podCount;
    this.capacity = hostsPerRack;
    this.lambda = cluster.lambda;
    this.podLambda = cluster.podLambda ?? Number.POSITIVE_INFINITY;
    this.size = new Int32Array(this.groups);
    this.rings = Int32Array.from(cluster.groups, (g) => g.rings);
    this.podOf = Int32Array.from({ length: racks }, (_, t) => podOfRack(cluster, t));
    this.count = Int32Array.from(counts);
    this.spread = new Int32Array(this.groups);
    this.largest = new Int32Array(this.groups);
    this.frag = new Int32Array(racks);
    this.occupancy = new Int32Array(racks);
    this.podCount = new Int32Array(this.groups * Math.max(this.pods, 1));
    this.podSpread = new Int32Array(this.groups);
    this.podFrag = new Int32Array(Math.max(this.pods, 1));
    for (let g = 0; g < this.groups; g++) {
      for (let t = 0; t < racks; t++) {
        const c = this.count[g * racks + t]!;
        if (c === 0) continue;
        this.size[g]! += c;
        this.spread[g]! += 1;
        this.occupancy[t]! += c;
        if (c > this.largest[g]!) this.largest[g] = c;
        if (this.pods > 0) {
          const i = g * this.pods + this.podOf[t]!;
          if (this.podCount[i] === 0) this.podSpread[g]! += 1;
          this.podCount[i]! += c;
        }
      }
      if (this.spread[g]! >= 2) {
        for (let t = 0; t < racks; t++) if (this.count[g * racks + t]! > 0) this.frag[t]! += this.rings[g]!;
      }
      if (this.podSpread[g]! >= 2) {
        for (let p = 0; p < this.pods; p++) if (this.podCount[g * this.pods + p]! > 0) this.podFrag[p]! += this.rings[g]!;
      }
    }
    for (let t = 0; t < racks; t++) {
      if (this.frag[t]! > this.lambda) this.overRacks++;
      if (this.occupancy[t]! > this.capacity) this.overCapacity++;
    }
    for (let p = 0; p < this.pods; p++) if (this.podFrag[p]! > this.podLambda) this.overPods++;
  }

  get valid(): boolean {
    return this.overRacks === 0 && this.overPods === 0 && this.overCapacity === 0;
  }

  at(g: number, t: number): number {
    return this.count[g * this.racks + t]!;
  }

  /** Moves one worker of group `g` from rack `s` to rack `d`; `move(g, d, s)` undoes it. */
  move(g: number, s: number, d: number): void {
    const base = g * this.racks;
    const cs = this.count[base + s]!;
    const cd = this.count[base + d]!;
    const rings = this.rings[g]!;
    const before = this.spread[g]!;
    const after = before - (cs === 1 ? 1 : 0) + (cd === 0 ? 1 : 0);
    this.count[base + s] = cs - 1;
    this.count[base + d] = cd + 1;
    this.spread[g] = after;
    this.refragment(before, after, cs === 1, cd === 0, s, d, rings, this.frag, this.lambda, true);
    this.addOccupancy(s, -1);
    this.addOccupancy(d, 1);
    if (cd + 1 > this.largest[g]!) this.largest[g] = cd + 1;
    else if (cs === this.largest[g]) {
      let largest = 0;
      for (let t = 0; t < this.racks; t++) largest = Math.max(largest, this.count[base + t]!);
      this.largest[g] = largest;
    }
    if (this.pods > 0) {
      const ps = this.podOf[s]!;
      const pd = this.podOf[d]!;
      if (ps === pd) return;
      const pbase = g * this.pods;
      const pcs = this.podCount[pbase + ps]!;
      const pcd = this.podCount[pbase + pd]!;
      const pbefore = this.podSpread[g]!;
      const pafter = pbefore - (pcs === 1 ? 1 : 0) + (pcd === 0 ? 1 : 0);
      this.podCount[pbase + ps] = pcs - 1;
      this.podCount[pbase + pd] = pcd + 1;
      this.podSpread[g] = pafter;
      this.refragment(pbefore, pafter, pcs === 1, pcd === 0, ps, pd, rings, this.podFrag, this.podLambda, false);
    }
  }

  /**
   * A group is fragmented while it spans two or more domains (racks or pods). Moving one worker
   * changes only the source and destination domains, except when the group becomes whole (its
   * last other domain loses it too) or stops being whole.
   */
  private refragment(
    before: number, after: number, leaves: boolean, enters: boolean,
    s: number, d: number, rings: number, frag: Int32Array, bound: number, racks: boolean,
  ): void {
    if (before >= 2 && after >= 2) {
      if (leaves) this.addFrag(frag, s, -rings, bound, racks);
      if (enters) this.addFrag(frag, d, rings, bound, racks);
    } else if (before >= 2) {
      this.addFrag(frag, s, -rings, bound, racks);
      this.addFrag(frag, d, -rings, bound, racks);
    } else if (after >= 2) {
      this.addFrag(frag, s, rings, bound, racks);
      this.addFrag(frag, d, rings, bound, racks);
    }
  }

  private addFrag(frag: Int32Array, i: number, delta: number, bound: number, racks: boolean): void {
    const was = frag[i]! > bound;
    frag[i]! += delta;
    const now = frag[i]! > bound;
    if (was === now) return;
    if (racks) this.overRacks += now ? 1 : -1;
    else this.overPods += now ? 1 : -1;
  }

  private addOccupancy(t: number, delta: number): void {
    const was = this.occupancy[t]! > this.capacity;
    this.occupancy[t]! += delta;
    const now = this.occupancy[t]! > this.capacity;
    if (was !== now) this.overCapacity += now ? 1 : -1;
  }
}
