import type { CountState } from "./counts.ts";

/** A worker of group `group` leaves rack `from` for rack `to` (counts level, no hosts yet). */
export interface RackMove {
  readonly group: number;
  readonly from: number;
  readonly to: number;
}

export type SearchOutcome =
  | { readonly kind: "found"; readonly moves: readonly RackMove[] }
  /** Every plan of at most `depth` moves was ruled out: the optimum is larger. */
  | { readonly kind: "exhausted"; readonly depth: number }
  /**
   * The deadline passed or the node budget ran out; plans of at most `depth` moves were
   * ruled out before that.
   */
  | { readonly kind: "timeout"; readonly depth: number };

export interface SearchOptions {
  /** Start deepening here; above 1 the search is a heuristic (see `searchMoves`). */
  readonly firstDepth?: number;
  /** Try only this many of the best-ranked branches at each node (a beam); exact when absent. */
  readonly beam?: number;
  /** Stop, as at the deadline, after visiting this many nodes: a bound that no machine's speed changes. */
  readonly nodeLimit?: number;
}

/**
 * Exact search for the fewest moves that bring every rack and pod within its bound and every
 * rack within capacity, by iterative deepening.
 *
 * Each node picks one defect (a rack over its bound, else a pod, else a rack over capacity)
 * and branches only on what every repair must do. A rack's fragmentation falls only when a
 * fragmented group on it leaves the rack or ends up whole on one rack, and either way some
 * worker of that group must leave a rack it is on; a full rack needs a worker to leave it. So
 * a branch lifts one worker off one rack — its destination is chosen later, once the bounds
 * hold, which keeps the branching free of the racks × racks destination choices. Placing
 * the lifted workers costs nothing more (their moves are already counted); only when every
 * placement breaks a bound does the search go on from a placement, repairing what it broke.
 * Depth d therefore proves that no plan of d or fewer moves exists when it fails. With
 * `firstDepth` > 1 or a `beam` it is a heuristic instead: the first plan it meets, valid but
 * not proven minimal. Branches are ranked either way (cheap lifts first, placements that keep
 * every bound first), which only changes how soon a plan is met.
 *
 * A minimal plan never moves a worker of a group onto a rack the group leaves, nor off a rack
 * it gains (the two moves could be one), so neither is tried. Capacity is only checked at
 * the leaves because all moves of a plan step are staged before any lands.
 */
export function searchMoves(state: CountState, maxDepth: number, deadline: number, options: SearchOptions = {}): SearchOutcome {
  return new Search(state, options).run(maxDepth, deadline);
}

/**
 * `searchMoves` that can be paused and resumed: each `run` deepens from where the last one
 * stopped, and keeps the table of states already proven short of a plan, so a pause costs
 * little of the work done before it. The anytime schedule (planner.ts) runs other phases in
 * between. After a `found` outcome the state holds the plan; call `run` no more.
 */
export class Search {
  private readonly beam: number;
  private readonly nodeLimit: number;
  private readonly lifts: [group: number, rack: number][] = [];
  private readonly drops: [group: number, rack: number][] = [];
  // Largest budget already proven insufficient from a state, by hash: the same lifts and
  // drops in another order reach the same state, and would otherwise be searched again.
  private readonly failed = new Map<number, number>();
  private nodes = 0;
  private deadline = 0;
  /** This run pauses once the search has visited this many nodes in all. */
  private pauseAt = Number.POSITIVE_INFINITY;
  private timedOut = false;
  /** The next depth to try: every plan shorter than it is ruled out. */
  private depth: number;

  constructor(
    private readonly state: CountState,
    options: SearchOptions = {},
  ) {
    this.beam = options.beam ?? Number.POSITIVE_INFINITY;
    this.nodeLimit = options.nodeLimit ?? Number.POSITIVE_INFINITY;
    this.depth = options.firstDepth ?? 1;
  }

  /** True once the node budget is spent: no later `run` does any work. */
  get spent(): boolean {
    return this.nodes >= this.nodeLimit;
  }

  /** Deepens up to `maxDepth`; pauses at `deadline`, or once `pauseAt` nodes are visited in all runs. */
  run(maxDepth: number, deadline: number, pauseAt = Number.POSITIVE_INFINITY): SearchOutcome {
    if (!hasDefect(this.state)) return { kind: "found", moves: [] };
    this.deadline = deadline;
    this.pauseAt = pauseAt;
    this.timedOut = false;
    for (; this.depth <= maxDepth; this.depth++) {
      if (this.dfs(this.depth)) return { kind: "found", moves: pair(this.lifts, this.drops) };
      if (this.timedOut) return { kind: "timeout", depth: this.depth - 1 };
    }
    return { kind: "exhausted", depth: maxDepth };
  }

  private dfs(depth: number): boolean {
    const state = this.state;
    if ((this.failed.get(state.hash) ?? -1) >= depth) return false;
    if (++this.nodes > Math.min(this.nodeLimit, this.pauseAt) || ((this.nodes & 127) === 0 && performance.now() > this.deadline)) this.timedOut = true;
    if (this.timedOut) return false;
    const found = hasDefect(state) ? this.repair(depth) : this.place(depth);
    if (!found && !this.timedOut) {
      // Past the cap the table starts over: it only saves repeated work, and an unbounded
      // one would outgrow memory (and V8's Map) on long searches.
      if (this.failed.size >= MEMO_LIMIT) this.failed.clear();
      this.failed.set(state.hash, depth);
    }
    return found;
  }

  private repair(depth: number): boolean {
    const state = this.state;
    if (depth === 0 || !withinReach(state, depth)) return false;
    for (const [g, s] of branches(state, depth).slice(0, this.beam)) {
      state.lift(g, s);
      this.lifts.push([g, s]);
      if (this.dfs(depth - 1)) return true;
      this.lifts.pop();
      state.drop(g, s);
      if (this.timedOut) return false;
    }
    return false;
  }

  // The bounds hold if the pending workers add nothing: place one of them, trying racks that
  // already host its group first (no new fragmentation there).
  private place(depth: number): boolean {
    const state = this.state;
    if (state.pendingTotal === 0) return true;
    const g = firstPending(state);
    for (const d of destinations(state, g).slice(0, this.beam)) {
      state.drop(g, d);
      this.drops.push([g, d]);
      if (this.dfs(depth)) return true;
      this.drops.pop();
      state.lift(g, d);
      if (this.timedOut) return false;
    }
    return false;
  }
}

const MEMO_LIMIT = 1 << 21;

const hasDefect = (state: CountState) => state.overRackSet.size > 0 || state.overPodSet.size > 0 || state.fullRackSet.size > 0;

function firstPending(state: CountState): number {
  for (let g = 0; g < state.groups; g++) if (state.pending[g]! > 0) return g;
  throw new RangeError("no pending worker");
}

/**
 * Racks a pending worker of `g` may land on (never one its group left), best first: racks
 * where it breaks no bound — its group's racks with room before new racks with room and
 * slack — then the rest, which the search must repair after.
 */
function destinations(state: CountState, g: number): number[] {
  const rings = state.rings[g]!;
  const widens = state.spread[g]! >= 1;
  const ranked: [rank: number, rack: number][] = [];
  for (let d = 0; d < state.racks; d++) {
    const here = state.at(g, d);
    if (here < state.initial[g * state.racks + d]!) continue;
    const room = state.occupancy[d]! < state.room[d]!;
    const slack = here > 0 || !widens || state.frag[d]! + rings <= state.bound[d]!;
    ranked.push([(room ? 0 : 2) + (slack ? 0 : 1) + (here > 0 ? 0 : 0.5), d]);
  }
  return ranked.sort((a, b) => a[0] - b[0] || a[1] - b[1]).map(([, d]) => d);
}

/** Lifts and drops of each group, paired into moves (a minimal plan never pairs a rack with itself). */
function pair(lifts: readonly [number, number][], drops: readonly [number, number][]): RackMove[] {
  const open = new Map<number, number[]>();
  for (const [g, d] of drops) open.set(g, [...(open.get(g) ?? []), d]);
  return lifts.map(([group, from]) => ({ group, from, to: open.get(group)!.shift()! }));
}

/**
 * A lower bound check: can `budget` moves possibly repair the state? A rack over its bound
 * sheds fragmented groups only by moves that start or end on it (a group leaves it, or
 * gathers on it), and a rack over capacity only by moves that start on it. Each move starts
 * on one rack and ends on one, so the racks' needs, summed, take at least half as many moves.
 */
export function withinReach(state: CountState, budget: number): boolean {
  // Pending workers land without spending budget, each touching one rack.
  const free = state.pendingTotal;
  let total = 0;
  const over = state.overRackSet;
  for (let i = 0; i < over.size; i++) {
    const t = over.items[i]!;
    const need = Math.max(overCapacity(state, t), touchesToShed(state, t, state.frag[t]! - state.bound[t]!, budget + free));
    if (need > budget + free) return false;
    total += need;
  }
  const full = state.fullRackSet;
  for (let i = 0; i < full.size; i++) {
    const t = full.items[i]!;
    if (state.frag[t]! > state.bound[t]!) continue;
    const need = overCapacity(state, t);
    if (need > budget) return false;
    total += need;
  }
  return total <= 2 * budget + free;
}

const overCapacity = (state: CountState, t: number) => Math.max(0, state.occupancy[t]! - state.room[t]!);

/**
 * Fewest moves touching rack `t` that shed `excess` rings from it (budget + 1 when more are
 * needed): a group leaves with all its workers on `t`, or gathers on `t` with all the others.
 */
function touchesToShed(state: CountState, t: number, excess: number, budget: number): number {
  // fewest[r] = fewest touches that shed r rings (capped at `excess`).
  const fewest = new Array<number>(excess + 1).fill(budget + 1);
  fewest[0] = 0;
  const on = state.groupsOn[t]!;
  for (let i = 0; i < on.size; i++) {
    const g = on.items[i]!;
    // A pinned group's rings stay wherever it is.
    if (state.spread[g]! < 2 || !state.movable[g]) continue;
    const here = state.at(g, t);
    const size = state.size[g]!;
    const cost = size <= state.capacity ? Math.min(here, size - here) : here;
    if (cost > budget) continue;
    const rings = state.rings[g]!;
    for (let r = excess; r > 0; r--) {
      const from = fewest[Math.max(0, r - rings)]! + cost;
      if (from < fewest[r]!) fewest[r] = from;
    }
  }
  return fewest[excess]!;
}

/**
 * Lifts that every repair of one defect must begin with (see `searchMoves`), for the defect
 * with the fewest of them: racks over their bound first, then pods, then racks over capacity.
 */
function branches(state: CountState, depth: number): [number, number][] {
  let best: Lifts | undefined;
  const consider = (lifts: Lifts) => {
    if (!best || lifts.size < best.size) best = lifts;
  };
  const over = state.overRackSet;
  for (let i = 0; i < over.size; i++) consider(rackLifts(state, over.items[i]!, depth));
  if (!best) {
    const pods = state.overPodSet;
    for (let i = 0; i < pods.size; i++) consider(podLifts(state, pods.items[i]!, depth));
  }
  if (!best) {
    const full = state.fullRackSet;
    for (let i = 0; i < full.size; i++) {
      const lifts = new Lifts(state);
      const t = full.items[i]!;
      const on = state.groupsOn[t]!;
      for (let k = 0; k < on.size; k++) lifts.add(on.items[k]!, t);
      consider(lifts);
    }
  }
  return best ? best.ranked() : [];
}

/**
 * Rack `t` sheds a fragmented group when it leaves `t` (lift its workers there) or gathers
 * on one rack `u` (lift its workers elsewhere; pending ones land on `u` for free).
 */
function rackLifts(state: CountState, t: number, depth: number): Lifts {
  const out = new Lifts(state);
  const on = state.groupsOn[t]!;
  for (let i = 0; i < on.size; i++) {
    const g = on.items[i]!;
    if (state.spread[g]! < 2 || !state.movable[g]) continue;
    if (state.at(g, t) <= depth) out.add(g, t);
    const size = state.size[g]! - state.pending[g]!;
    if (state.size[g]! > state.capacity || size - state.largest[g]! > depth) continue;
    for (let u = 0; u < state.racks; u++) {
      if (state.at(g, u) === 0 || size - state.at(g, u) > depth) continue;
      for (let s = 0; s < state.racks; s++) if (s !== u) out.add(g, s);
    }
  }
  return out;
}

/** Pod `pod` sheds a group when it leaves the pod or gathers inside one pod. */
function podLifts(state: CountState, pod: number, depth: number): Lifts {
  const out = new Lifts(state);
  for (let g = 0; g < state.groups; g++) {
    const here = state.podCount[g * state.pods + pod]!;
    if (here === 0 || state.podSpread[g]! < 2 || !state.movable[g]) continue;
    const size = state.size[g]! - state.pending[g]!;
    for (let s = 0; s < state.racks; s++) {
      if (state.at(g, s) === 0) continue;
      const inPod = state.podOf[s] === pod;
      const gathers = (q: number) => q !== state.podOf[s] && size - state.podCount[g * state.pods + q]! <= depth;
      let useful = inPod && here <= depth;
      for (let q = 0; q < state.pods && !useful; q++) useful = state.podCount[g * state.pods + q]! > 0 && gathers(q);
      if (useful) out.add(g, s);
    }
  }
  return out;
}

/** Distinct lifts a minimal plan may make, in the order first added (deterministic). */
class Lifts {
  readonly list: [number, number][] = [];
  private readonly seen = new Set<number>();

  constructor(private readonly state: CountState) {}

  get size(): number {
    return this.list.length;
  }

  /** Lifts off racks where the group has fewest workers first: cheapest to clear. */
  ranked(): [number, number][] {
    const at = ([g, t]: [number, number]) => this.state.at(g, t);
    return [...this.list].sort((a, b) => at(a) - at(b));
  }

  add(group: number, rack: number): void {
    const cell = group * this.state.racks + rack;
    const here = this.state.count[cell]!;
    // Never take a worker off a rack its group has gained (a minimal plan would not have
    // brought it there), nor a pinned group's.
    if (here === 0 || here > this.state.initial[cell]! || !this.state.movable[group] || this.seen.has(cell)) return;
    this.seen.add(cell);
    this.list.push([group, rack]);
  }
}
