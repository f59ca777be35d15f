import type { ModelData } from "highs";
import type { Counts, CountState } from "./counts.ts";
import { MipBuilder } from "./mip.ts";

/** A placement program: the HiGHS model, and how to read worker counts out of a solution. */
export interface PlacementProgram {
  readonly model: ModelData;
  /** Worker moves = objective × this (the paper counts each move twice, once per side). */
  readonly movesPerObjective: number;
  decode(values: Float64Array): Counts;
  /** A full column vector for a known placement, used as HiGHS's starting incumbent. */
  encode(counts: Counts): Float64Array;
}

interface Cell {
  readonly w: number;
  readonly x: number;
  readonly y: number;
  readonly d: number;
  /** Workers on available hosts (`availableColumn`); `w` itself when none are on unavailable ones. */
  readonly e: number;
}

/**
 * MonkeyTree's program. Every group may move — fragmented or not, in part or whole — so it is
 * feasible whenever any placement meets the bounds. "Whole on rack t" is linked by
 * `size·y ≤ w` rather than the paper's `Σ_{t'≠t} x ≤ (T−1)(1−y)`: the same integer points,
 * a much tighter relaxation. Only workers leaving a rack are paid for (`d ≥ w0 − w`), since
 * arrivals equal departures. `minMoves` is a proven lower bound on the optimum. A pinned
 * group's counts are fixed at where it is; racks take workers up to their available hosts
 * (`availableColumn`) and fragmentation up to `CountState.bound`. With `soft` a rack's bound
 * may be passed (see there): the best effort when no plan meets every bound.
 */
export function monkeytreeProgram(state: CountState, minMoves = 0, soft = false): PlacementProgram {
  const mip = new MipBuilder();
  const { groups, racks } = state;
  const cells = range(groups, (g) => addGroupCells(mip, state, g)).flat();
  // Soft: a rack may pass its bound at a cost above any number of moves, so the optimum first
  // leaves the least fragmentation over the bounds, then takes the fewest moves to do it.
  const overCost = soft ? sum(groups, (g) => state.size[g]!) + 1 : undefined;
  for (let t = 0; t < racks; t++) addRackRows(mip, state, cells, t, overCost);
  const pods = addPodBound(mip, state, (g, t) => cells[g * racks + t]!.w);
  // A lower bound proven elsewhere (the exact search) lifts the relaxation's bound at once, so
  // HiGHS can stop as soon as it finds a plan that meets it.
  if (minMoves > 0)
    mip.row(
      cells.flatMap((cell) => (cell.d >= 0 ? [[cell.d, 1] as const] : [])),
      minMoves,
      Number.POSITIVE_INFINITY,
    );
  return placementProgram(mip, state, cells, pods, 1, (w0, w) => Math.max(0, w0 - w));
}

/**
 * Group `g`'s cells, one a rack, and the row that places all its workers. A pinned group's
 * counts are fixed where they are, and it has no departures to pay for.
 */
function addGroupCells(mip: MipBuilder, state: CountState, g: number): Cell[] {
  const size = state.size[g]!;
  const upper = Math.min(size, state.capacity);
  const movable = state.movable[g] === 1;
  const cells = range(state.racks, (t) => {
    const w0 = state.at(g, t);
    const w = movable ? mip.variable(0, 0, upper, true) : mip.variable(0, w0, w0, true);
    const x = mip.variable(0, 0, 1, true);
    const y = size <= state.capacity ? mip.variable(0, 0, 1, true) : -1;
    const d = w0 > 0 && movable ? mip.variable(1, 0, w0, false) : -1;
    const cell = { w, x, y, d, e: availableColumn(mip, state, g * state.racks + t, w, upper) };
    mip.row(
      [
        [w, 1],
        [x, -upper],
      ],
      Number.NEGATIVE_INFINITY,
      0,
    );
    if (y >= 0)
      mip.row(
        [
          [y, size],
          [w, -1],
        ],
        Number.NEGATIVE_INFINITY,
        0,
      );
    if (d >= 0)
      mip.row(
        [
          [d, 1],
          [w, 1],
        ],
        w0,
        Number.POSITIVE_INFINITY,
      );
    return cell;
  });
  mip.row(
    cells.map((cell) => [cell.w, 1]),
    size,
    size,
  );
  return cells;
}

/** Rack `t`'s capacity and fragmentation rows; with `overCost` the bound may be passed at that cost a ring. */
function addRackRows(mip: MipBuilder, state: CountState, cells: readonly Cell[], t: number, overCost: number | undefined): void {
  mip.row(
    range(state.groups, (g) => [cells[g * state.racks + t]!.e, 1]),
    Number.NEGATIVE_INFINITY,
    state.room[t]!,
  );
  const over = overCost === undefined ? [] : [[mip.variable(overCost, 0, Number.POSITIVE_INFINITY, false), -1] as [number, number]];
  mip.row([...fragTerms(state, cells, t), ...over], Number.NEGATIVE_INFINITY, state.bound[t]!);
}

/**
 * The paper's program (its appendix) as published: only fragmented groups are variables,
 * everything else is frozen and only reduces rack capacity; `y` is linked by the big-M
 * `Σ_{t'≠t} x ≤ (T−1)(1−y)` and the objective counts |w − w0| on both sides. Kept as the
 * baseline the benchmark compares against. Pinned groups are frozen too (their rings are
 * constants where they fragment a rack), and racks hold workers up to their available hosts.
 */
export function paperProgram(state: CountState): PlacementProgram {
  const mip = new MipBuilder();
  const { groups, racks } = state;
  const movable = range(groups, (g) => g).filter((g) => state.spread[g]! >= 2 && state.movable[g] === 1);
  const frozen = frozenShares(state, new Set(movable));
  const cells = new Map<number, Cell>();
  for (const g of movable) addPaperGroupCells(mip, state, g, frozen.free, cells);
  for (let t = 0; t < racks; t++) {
    const at = (g: number) => cells.get(g * racks + t)!;
    mip.row(
      movable.map((g) => [at(g).e, 1] as const),
      Number.NEGATIVE_INFINITY,
      frozen.free[t]!,
    );
    mip.row(
      movable.flatMap(
        (g) =>
          [
            [at(g).x, state.rings[g]!],
            [at(g).y, -state.rings[g]!],
          ] as const,
      ),
      Number.NEGATIVE_INFINITY,
      state.bound[t]! - frozen.rings[t]!,
    );
  }
  const pods = addPodBound(mip, state, (g, t) => cells.get(g * racks + t)?.w, movable);
  return placementProgram(mip, state, cells, pods, 0.5, (w0, w) => Math.abs(w0 - w));
}

/** What the groups outside `moving` leave of each rack: its free available hosts, and the rings they fragment it with. */
function frozenShares(state: CountState, moving: ReadonlySet<number>): { free: number[]; rings: number[] } {
  const { groups, racks } = state;
  const frozen = (t: number, f: (g: number) => number) => sum(groups, (g) => (moving.has(g) || state.at(g, t) === 0 ? 0 : f(g)));
  return {
    free: range(racks, (t) => state.room[t]! - frozen(t, (g) => Math.max(0, state.at(g, t) - state.heldAt(g * racks + t)))),
    rings: range(racks, (t) => frozen(t, (g) => (state.spread[g]! >= 2 ? state.rings[g]! : 0))),
  };
}

/** Group `g`'s cells in the paper's program, added to `cells`, with the rows that place all its workers and link each `y`. */
function addPaperGroupCells(mip: MipBuilder, state: CountState, g: number, free: readonly number[], cells: Map<number, Cell>): void {
  const { racks } = state;
  const size = state.size[g]!;
  for (let t = 0; t < racks; t++) {
    const w0 = state.at(g, t);
    const upper = Math.max(0, Math.min(size, free[t]! + state.heldAt(g * racks + t)));
    const w = mip.variable(0, 0, upper, true);
    const x = mip.variable(0, 0, 1, true);
    const y = mip.variable(0, 0, 1, true);
    const d = mip.variable(1, 0, Number.POSITIVE_INFINITY, false);
    cells.set(g * racks + t, { w, x, y, d, e: availableColumn(mip, state, g * racks + t, w, upper) });
    mip.row(
      [
        [w, 1],
        [x, -upper],
      ],
      Number.NEGATIVE_INFINITY,
      0,
    );
    mip.row(
      [
        [d, 1],
        [w, -1],
      ],
      -w0,
      Number.POSITIVE_INFINITY,
    );
    mip.row(
      [
        [d, 1],
        [w, 1],
      ],
      w0,
      Number.POSITIVE_INFINITY,
    );
    mip.row(
      [
        [y, 1],
        [x, -1],
      ],
      Number.NEGATIVE_INFINITY,
      0,
    );
  }
  const cell = (t: number) => cells.get(g * racks + t)!;
  mip.row(
    range(racks, (t) => [cell(t).w, 1]),
    size,
    size,
  );
  for (let t = 0; t < racks; t++) {
    const others = range(racks, (u) => u).filter((u) => u !== t);
    mip.row([...others.map((u) => [cell(u).x, 1] as const), [cell(t).y, racks - 1]], Number.NEGATIVE_INFINITY, racks - 1);
  }
}

/**
 * The program built in `mip`, whose `cells` (by cell index) are every count it may change;
 * `departed` is a cell's departure column's value when its count goes from `w0` to `w`.
 */
function placementProgram(
  mip: MipBuilder,
  state: CountState,
  cells: ReadonlyMap<number, Cell> | readonly Cell[],
  pods: PodBound,
  movesPerObjective: number,
  departed: (w0: number, w: number) => number,
): PlacementProgram {
  return {
    model: mip.build(),
    movesPerObjective,
    decode: (values) => {
      const counts = Int32Array.from(state.count);
      for (const [i, cell] of cells.entries()) counts[i] = Math.round(values[cell.w]!);
      return counts;
    },
    encode: (counts) => {
      const start = new Float64Array(mip.columns);
      for (const [i, cell] of cells.entries()) {
        const w = counts[i]!;
        start[cell.w] = w;
        start[cell.x] = w > 0 ? 1 : 0;
        if (cell.y >= 0) start[cell.y] = w === state.size[Math.floor(i / state.racks)] ? 1 : 0;
        if (cell.d >= 0) start[cell.d] = departed(state.count[i]!, w);
        if (cell.e !== cell.w) start[cell.e] = Math.max(0, w - state.heldAt(i));
      }
      pods.encode(counts, start);
      return start;
    },
  };
}

/**
 * The column counting cell `cell`'s workers on available hosts: `w` itself, or, where some of
 * them sit on unavailable hosts (which they may keep, and nobody else may take), a column
 * e ≥ w − held, e ≥ 0. Only rack capacity rows use it, which push it down to max(0, w − held).
 */
function availableColumn(mip: MipBuilder, state: CountState, cell: number, w: number, upper: number): number {
  const held = state.heldAt(cell);
  if (held === 0) return w;
  const e = mip.variable(0, 0, upper, false);
  mip.row(
    [
      [e, 1],
      [w, -1],
    ],
    -held,
    Number.POSITIVE_INFINITY,
  );
  return e;
}

function fragTerms(state: CountState, cells: readonly Cell[], t: number): [number, number][] {
  const terms: [number, number][] = [];
  for (let g = 0; g < state.groups; g++) {
    const cell = cells[g * state.racks + t]!;
    terms.push([cell.x, state.rings[g]!]);
    if (cell.y >= 0) terms.push([cell.y, -state.rings[g]!]);
  }
  return terms;
}

/** Fills in the pod-level bound's columns of a starting solution. */
interface PodBound {
  encode(counts: Counts, start: Float64Array): void;
}

/**
 * The pod-level bound (MonkeyTree3): pods play the part of racks, with presence `z` and
 * "whole in this pod" `v` per group and pod. Groups for which `column` gives no variable are
 * frozen and counted as constants.
 */
function addPodBound(
  mip: MipBuilder,
  state: CountState,
  column: (g: number, t: number) => number | undefined,
  groups: readonly number[] = range(state.groups, (g) => g),
): PodBound {
  const { pods, racks } = state;
  if (pods === 0) return { encode: () => {} };
  const podCapacity = state.capacity * (racks / pods);
  const cells: { g: number; p: number; z: number; v: number }[] = [];
  for (const g of groups) {
    const size = state.size[g]!;
    for (let p = 0; p < pods; p++) {
      const members = range(racks, (t) => t).filter((t) => state.podOf[t] === p);
      const upper = Math.min(size, podCapacity);
      const z = mip.variable(0, 0, 1, true);
      const v = size <= podCapacity ? mip.variable(0, 0, 1, true) : -1;
      cells.push({ g, p, z, v });
      const w = members.map((t) => [column(g, t)!, 1] as const);
      mip.row([...w, [z, -upper]], Number.NEGATIVE_INFINITY, 0);
      if (v >= 0) mip.row([[v, size], ...w.map(([c]) => [c, -1] as const)], Number.NEGATIVE_INFINITY, 0);
    }
  }
  const moving = new Set(groups);
  for (let p = 0; p < pods; p++) {
    const frozen = sum(state.groups, (g) => (!moving.has(g) && state.podSpread[g]! >= 2 && state.podCount[g * pods + p]! > 0 ? state.rings[g]! : 0));
    const terms = cells
      .filter((cell) => cell.p === p)
      .flatMap((cell) => [[cell.z, state.rings[cell.g]!] as const, ...(cell.v >= 0 ? [[cell.v, -state.rings[cell.g]!] as const] : [])]);
    mip.row(terms, Number.NEGATIVE_INFINITY, state.podBound[p]! - frozen);
  }
  return {
    encode: (counts, start) => {
      for (const cell of cells) {
        let inPod = 0;
        for (let t = 0; t < racks; t++) if (state.podOf[t] === cell.p) inPod += counts[cell.g * racks + t]!;
        start[cell.z] = inPod > 0 ? 1 : 0;
        if (cell.v >= 0) start[cell.v] = inPod === state.size[cell.g] ? 1 : 0;
      }
    },
  };
}

function range<T>(n: number, f: (i: number) => T): T[] {
  return Array.from({ length: n }, (_, i) => f(i));
}

function sum(n: number, f: (i: number) => number): number {
  let total = 0;
  for (let i = 0; i < n; i++) total += f(i);
  return total;
}
