import { podOfRack, rackOf, type Cluster, type Placement } from "../model/cluster.ts";
import { plannedBounds, type Bounds } from "../model/fragmentation.ts";

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

/** A set of small integers with O(1) add, delete and iteration over members. */
export class IndexSet {
  readonly items: Int32Array;
  private readonly position: Int32Array;
  size = 0;

  constructor(universe: number) {
    this.items = new Int32Array(universe);
    this.position = new Int32Array(universe).fill(-1);
  }

  add(i: number): void {
    if (this.position[i] !== -1) return;
    this.position[i] = this.size;
    this.items[this.size++] = i;
  }

  delete(i: number): void {
    const at = this.position[i]!;
    if (at === -1) return;
    const last = this.items[--this.size]!;
    this.items[at] = last;
    this.position[last] = at;
    this.position[i] = -1;
  }
}

/**
 * Counts with incremental fragmentation, occupancy and bound-violation bookkeeping, so a
 * search can try a worker move and undo it in O(1) (plus O(racks the group spans) for its
 * largest rack share).
 */
export class CountState {
  readonly groups: number;
  readonly racks: number;
  readonly pods: number;
  /** Hosts per rack: the most workers of one group a rack can hold. */
  readonly capacity: number;
  /** Available hosts per rack (not `unavailable`): what `occupancy` may reach. */
  readonly room: Int32Array;
  /** Per-rack and per-pod bounds (`plannedBounds`: λ, or a pinned floor above it). */
  readonly bound: Int32Array;
  readonly podBound: Float64Array;
  /** 1 for groups a plan may move; pinned groups' counts never change. */
  readonly movable: Uint8Array;
  /**
   * Workers per (group, rack) on unavailable hosts, empty when there are none. They may stay;
   * a group leaving a rack vacates its available hosts first, so they leave last.
   */
  readonly held: Int32Array;
  readonly size: Int32Array;
  readonly rings: Int32Array;
  readonly podOf: Int32Array;
  readonly count: Int32Array;
  /** Racks each group occupies. */
  readonly spread: Int32Array;
  /** Largest number of a group's workers on one rack. */
  readonly largest: Int32Array;
  readonly frag: Int32Array;
  /** Workers on available hosts per rack: Σ over groups of max(0, count − held). */
  readonly occupancy: Int32Array;
  readonly podCount: Int32Array;
  readonly podSpread: Int32Array;
  readonly podFrag: Int32Array;
  /** Racks over their fragmentation bound, pods over theirs, racks over capacity. */
  readonly overRackSet: IndexSet;
  readonly overPodSet: IndexSet;
  readonly fullRackSet: IndexSet;
  /** Groups with a worker on each rack. */
  readonly groupsOn: IndexSet[];
  /**
   * Racks with a worker of each group, in no order: what a move scans for the group's largest
   * piece and its last rack, where the whole row of racks would be O(racks) a move.
   */
  readonly racksOf: number[][];
  /** A 53-bit hash of the counts, kept up to date by `move` (see `cellKey`). */
  hash = 0;
  /** Counts of the starting placement: a minimal plan never moves a group onto a rack it leaves. */
  readonly initial: Int32Array;
  /** Workers lifted off their rack whose destination is not chosen yet, per group. */
  readonly pending: Int32Array;
  pendingTotal = 0;

  constructor(cluster: Cluster, counts: Counts = countsOf(cluster), bounds: Bounds = plannedBounds(cluster)) {
    const { racks, hostsPerRack } = cluster.topology;
    this.groups = cluster.groups.length;
    this.racks = racks;
    this.pods = cluster.podLambda === undefined ? 0 : cluster.podCount;
    this.capacity = hostsPerRack;
    this.bound = Int32Array.from(bounds.racks);
    this.podBound = Float64Array.from(this.pods > 0 ? bounds.pods : [Number.POSITIVE_INFINITY]);
    this.movable = Uint8Array.from(cluster.groups, (g) => (g.movable ? 1 : 0));
    this.room = new Int32Array(racks).fill(hostsPerRack);
    const unavailable = new Set(cluster.unavailable);
    for (const h of unavailable) this.room[rackOf(cluster, h)]! -= 1;
    this.held = new Int32Array(unavailable.size > 0 ? this.groups * racks : 0);
    if (unavailable.size > 0) {
      cluster.placement.forEach((hosts, g) => {
        for (const h of hosts) if (unavailable.has(h)) this.held[g * racks + rackOf(cluster, h)]! += 1;
      });
    }
    this.size = new Int32Array(this.groups);
    this.rings = Int32Array.from(cluster.groups, (g) => g.rings);
    this.podOf = Int32Array.from({ length: racks }, (_, t) => podOfRack(cluster, t));
    this.count = Int32Array.from(counts);
    this.initial = Int32Array.from(counts);
    this.pending = new Int32Array(this.groups);
    this.spread = new Int32Array(this.groups);
    this.largest = new Int32Array(this.groups);
    this.frag = new Int32Array(racks);
    this.occupancy = new Int32Array(racks);
    this.podCount = new Int32Array(this.groups * Math.max(this.pods, 1));
    this.podSpread = new Int32Array(this.groups);
    this.podFrag = new Int32Array(Math.max(this.pods, 1));
    this.overRackSet = new IndexSet(racks);
    this.overPodSet = new IndexSet(Math.max(this.pods, 1));
    this.fullRackSet = new IndexSet(racks);
    this.groupsOn = Array.from({ length: racks }, () => new IndexSet(this.groups));
    this.racksOf = Array.from({ length: this.groups }, () => []);
    for (let g = 0; g < this.groups; g++) {
      for (let t = 0; t < racks; t++) {
        const c = this.count[g * racks + t]!;
        if (c === 0) continue;
        this.size[g]! += c;
        this.spread[g]! += 1;
        this.groupsOn[t]!.add(g);
        this.racksOf[g]!.push(t);
        this.hash = xor53(this.hash, cellKey(g * racks + t, c));
        this.occupancy[t]! += Math.max(0, c - this.heldAt(g * racks + t));
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
      if (this.frag[t]! > this.bound[t]!) this.overRackSet.add(t);
      if (this.occupancy[t]! > this.room[t]!) this.fullRackSet.add(t);
    }
    for (let p = 0; p < this.pods; p++) if (this.podFrag[p]! > this.podBound[p]!) this.overPodSet.add(p);
  }

  get valid(): boolean {
    return this.overRackSet.size === 0 && this.overPodSet.size === 0 && this.fullRackSet.size === 0;
  }

  at(g: number, t: number): number {
    return this.count[g * this.racks + t]!;
  }

  heldAt(cell: number): number {
    return this.held.length === 0 ? 0 : this.held[cell]!;
  }

  /** Moves one worker of group `g` from rack `s` to rack `d`; `move(g, d, s)` undoes it. */
  move(g: number, s: number, d: number): void {
    this.lift(g, s);
    this.drop(g, d);
  }

  /**
   * Takes one worker of group `g` off rack `s` into the pending pool: the state then shows the
   * fragmentation the plan would have wherever the worker lands without adding any (the most
   * optimistic view), which is what lets a search defer the destination. `drop(g, s)` undoes it.
   */
  lift(g: number, s: number): void {
    const cell = g * this.racks + s;
    const c = this.count[cell]!;
    this.count[cell] = c - 1;
    this.hash = xor53(this.hash, xor53(cellKey(cell, c), cellKey(cell, c - 1)));
    this.setPending(g, 1);
    if (c > this.heldAt(cell)) this.addOccupancy(s, -1);
    if (c === 1) {
      this.groupsOn[s]!.delete(g);
      const on = this.racksOf[g]!;
      on[on.indexOf(s)] = on[on.length - 1]!;
      on.pop();
      this.spread[g]! -= 1;
      this.resplit(g, this.spread[g]! + 1, this.frag, this.bound, true, s, -1, () => otherThan(on, s));
    }
    if (c === this.largest[g]) {
      let largest = 0;
      for (const t of this.racksOf[g]!) largest = Math.max(largest, this.count[g * this.racks + t]!);
      this.largest[g] = largest;
    }
    if (this.pods > 0) {
      const pcell = g * this.pods + this.podOf[s]!;
      const pc = this.podCount[pcell]!;
      this.podCount[pcell] = pc - 1;
      if (pc === 1) {
        this.podSpread[g]! -= 1;
        this.resplit(g, this.podSpread[g]! + 1, this.podFrag, this.podBound, false, this.podOf[s]!, -1, () => this.otherPod(g, this.podOf[s]!));
      }
    }
  }

  /** Puts one pending worker of group `g` on rack `d`; `lift(g, d)` undoes it. */
  drop(g: number, d: number): void {
    const cell = g * this.racks + d;
    const c = this.count[cell]!;
    this.count[cell] = c + 1;
    this.hash = xor53(this.hash, xor53(cellKey(cell, c), cellKey(cell, c + 1)));
    this.setPending(g, -1);
    if (c >= this.heldAt(cell)) this.addOccupancy(d, 1);
    if (c + 1 > this.largest[g]!) this.largest[g] = c + 1;
    if (c === 0) {
      this.groupsOn[d]!.add(g);
      this.racksOf[g]!.push(d);
      this.spread[g]! += 1;
      this.resplit(g, this.spread[g]! - 1, this.frag, this.bound, true, d, 1, () => otherThan(this.racksOf[g]!, d));
    }
    if (this.pods > 0) {
      const pcell = g * this.pods + this.podOf[d]!;
      const pc = this.podCount[pcell]!;
      this.podCount[pcell] = pc + 1;
      if (pc === 0) {
        this.podSpread[g]! += 1;
        this.resplit(g, this.podSpread[g]! - 1, this.podFrag, this.podBound, false, this.podOf[d]!, 1, () => this.otherPod(g, this.podOf[d]!));
      }
    }
  }

  /**
   * Group `g` left (`delta` −1) or entered (+1) domain `at`, going from `before` domains to
   * `before + delta`. A group adds its rings to every domain it spans while it spans two or
   * more, so only crossing between one and two domains touches a domain other than `at`.
   */
  private resplit(g: number, before: number, frag: Int32Array, bound: ArrayLike<number>, racks: boolean, at: number, delta: 1 | -1, other: () => number): void {
    const rings = this.rings[g]!;
    const after = before + delta;
    if (before >= 2 && after >= 2) {
      this.addFrag(frag, at, delta * rings, bound, racks);
    } else if (Math.max(before, after) === 2) {
      // 2 → 1: `at` and the one remaining domain stop counting the group; 1 → 2: both start.
      this.addFrag(frag, at, delta * rings, bound, racks);
      this.addFrag(frag, other(), delta * rings, bound, racks);
    }
  }

  /** The pod other than `at` that holds group `g`, where it spans two. */
  private otherPod(g: number, at: number): number {
    for (let p = 0; p < this.pods; p++) if (p !== at && this.podCount[g * this.pods + p]! > 0) return p;
    throw new RangeError(`group ${g} spans no pod but ${at}`);
  }

  private setPending(g: number, delta: number): void {
    const n = this.pending[g]!;
    const cell = this.groups * this.racks + g;
    this.hash = xor53(this.hash, xor53(cellKey(cell, n), cellKey(cell, n + delta)));
    this.pending[g] = n + delta;
    this.pendingTotal += delta;
  }

  private addFrag(frag: Int32Array, i: number, delta: number, bound: ArrayLike<number>, racks: boolean): void {
    frag[i]! += delta;
    const over = racks ? this.overRackSet : this.overPodSet;
    if (frag[i]! > bound[i]!) over.add(i);
    else over.delete(i);
  }

  private addOccupancy(t: number, delta: number): void {
    this.occupancy[t]! += delta;
    if (this.occupancy[t]! > this.room[t]!) this.fullRackSet.add(t);
    else this.fullRackSet.delete(t);
  }
}

/** The rack in `racks` other than `at`, where a group spans exactly two. */
function otherThan(racks: readonly number[], at: number): number {
  for (const t of racks) if (t !== at) return t;
  throw new RangeError(`a group spans no rack but ${at}`);
}

/**
 * Zobrist-style key of "cell `cell` holds `count` workers", 53 bits so it stays an exact
 * JavaScript number; a state's hash is the XOR of its non-empty cells' keys.
 */
function cellKey(cell: number, count: number): number {
  if (count === 0) return 0;
  const high = mix32(cell * 0x9e3779b1 + count * 0x85ebca6b) & 0x1fffff;
  const low = mix32((cell ^ 0x5bd1e995) * 0xc2b2ae35 + count);
  return high * 0x100000000 + low;
}

function mix32(x: number): number {
  let h = x >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

function xor53(a: number, b: number): number {
  const high = ((a / 0x100000000) ^ (b / 0x100000000)) & 0x1fffff;
  return high * 0x100000000 + ((a ^ b) >>> 0);
}
