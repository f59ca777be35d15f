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
  /** The deadline passed; plans of at most `depth` moves were ruled out before it. */
  | { readonly kind: "timeout"; readonly depth: number };

/**
 * Exact search for the fewest moves that bring every rack and pod within its bound and every
 * rack within capacity, by iterative deepening.
 *
 * Each node picks one defect (a rack over its bound, else a pod, else a rack over capacity)
 * and branches only on moves that every completion must contain: a rack's fragmentation falls
 * only when a fragmented group on it leaves the rack entirely or ends up whole on one rack, so
 * the branches are "move a worker of such a group out of the rack" (when it has few enough
 * workers there) and "move a worker of it onto the rack it could be made whole on". Depth d
 * therefore proves that no plan of d or fewer moves exists when it fails. Capacity is only
 * checked at the leaves because all moves of a plan step are staged before any lands, so swaps
 * and cycles need no free host in between.
 */
export function searchMoves(state: CountState, maxDepth: number, deadline: number): SearchOutcome {
  const path: RackMove[] = [];
  let nodes = 0;
  let timedOut = false;

  const dfs = (depth: number): boolean => {
    if (state.valid) return true;
    if (depth === 0 || !withinReach(state, depth)) return false;
    if ((++nodes & 1023) === 0 && performance.now() > deadline) {
      timedOut = true;
      return false;
    }
    for (const move of branches(state, depth)) {
      state.move(move.group, move.from, move.to);
      path.push(move);
      if (dfs(depth - 1)) return true;
      path.pop();
      state.move(move.group, move.to, move.from);
      if (timedOut) return false;
    }
    return false;
  };

  if (state.valid) return { kind: "found", moves: [] };
  for (let depth = 1; depth <= maxDepth; depth++) {
    if (dfs(depth)) return { kind: "found", moves: [...path] };
    if (timedOut) return { kind: "timeout", depth: depth - 1 };
  }
  return { kind: "exhausted", depth: maxDepth };
}

/**
 * A lower bound check: can `budget` moves possibly repair the state? Each move empties at
 * most one worker slot of an over-full rack, and each rack over its bound needs enough
 * fragmented groups removed from it (leaving or made whole, at their cheapest cost).
 */
export function withinReach(state: CountState, budget: number): boolean {
  let excess = 0;
  for (let t = 0; t < state.racks; t++) excess += Math.max(0, state.occupancy[t]! - state.capacity);
  if (excess > budget) return false;
  for (let t = 0; t < state.racks; t++) {
    const need = state.frag[t]! - state.lambda;
    if (need > 0 && bestRelief(state, t, budget) < need) return false;
  }
  return true;
}

/** Largest fragmentation rack `t` can shed with `budget` moves: a 0/1 knapsack over its groups. */
function bestRelief(state: CountState, t: number, budget: number): number {
  const best = new Array<number>(budget + 1).fill(0);
  for (let g = 0; g < state.groups; g++) {
    const here = state.at(g, t);
    if (here === 0 || state.spread[g]! < 2) continue;
    const cost = Math.min(here, state.size[g]! - state.largest[g]!);
    if (cost > budget) continue;
    const rings = state.rings[g]!;
    for (let b = budget; b >= cost; b--) best[b] = Math.max(best[b]!, best[b - cost]! + rings);
  }
  return best[budget]!;
}

/** Moves that every repair of the first defect must include (see `searchMoves`). */
function branches(state: CountState, depth: number): RackMove[] {
  const seen = new Set<number>();
  const out: RackMove[] = [];
  const add = (group: number, from: number, to: number) => {
    if (from === to || state.at(group, from) === 0) return;
    const key = (group * state.racks + from) * state.racks + to;
    if (seen.has(key)) return;
    seen.add(key);
    out.push({ group, from, to });
  };
  const rack = firstOver(state.frag, state.racks, state.lambda);
  if (rack >= 0) {
    for (let g = 0; g < state.groups; g++) {
      const here = state.at(g, rack);
      if (here === 0 || state.spread[g]! < 2) continue;
      if (here <= depth) for (let d = 0; d < state.racks; d++) add(g, rack, d);
      wholeOn(state, g, depth, add);
    }
    return out;
  }
  const pod = firstOver(state.podFrag, state.pods, state.podLambda);
  if (pod >= 0) {
    for (let g = 0; g < state.groups; g++) {
      const here = state.podCount[g * state.pods + pod]!;
      if (here === 0 || state.podSpread[g]! < 2) continue;
      if (here <= depth) {
        for (let s = 0; s < state.racks; s++) {
          if (state.podOf[s] !== pod) continue;
          for (let d = 0; d < state.racks; d++) if (state.podOf[d] !== pod) add(g, s, d);
        }
      }
      for (let q = 0; q < state.pods; q++) {
        if (state.size[g]! - state.podCount[g * state.pods + q]! > depth) continue;
        for (let s = 0; s < state.racks; s++) {
          if (state.podOf[s] === q) continue;
          for (let d = 0; d < state.racks; d++) if (state.podOf[d] === q) add(g, s, d);
        }
      }
    }
    return out;
  }
  const full = firstOver(state.occupancy, state.racks, state.capacity);
  for (let g = 0; g < state.groups; g++) {
    if (state.at(g, full) === 0) continue;
    for (let d = 0; d < state.racks; d++) add(g, full, d);
  }
  return out;
}

/** Moves that pull group `g` onto a rack it could be made whole on within `depth` moves. */
function wholeOn(state: CountState, g: number, depth: number, add: (g: number, s: number, d: number) => void): void {
  const size = state.size[g]!;
  if (size > state.capacity || size - state.largest[g]! > depth) return;
  for (let u = 0; u < state.racks; u++) {
    if (size - state.at(g, u) > depth) continue;
    for (let s = 0; s < state.racks; s++) add(g, s, u);
  }
}

function firstOver(values: Int32Array, length: number, bound: number): number {
  for (let i = 0; i < length; i++) if (values[i]! > bound) return i;
  return -1;
}
