import type { CountState, Counts, IndexSet } from "./counts.ts";

/** Steps the repair takes at most; the hard events of `test/plan/repair.test.ts` settle in under 60. */
export const REPAIR_STEPS = 200;
/**
 * Steps it weighs at most, over all its steps: a bound on its work that no machine's speed
 * changes, so that it ends the same everywhere. Its 200 steps weigh under 40,000 on the hard
 * 2,048-GPU events (about 200 a millisecond on one core of a 2-core machine); the planner's
 * deadline still applies.
 */
export const REPAIR_TRIALS = 1_000_000;
/** Steps a group may not go back onto a rack it left: long enough to stop a step and its undo cycling. */
const TABU_STEPS = 7;
/** Defects outweigh any number of moves a plan could make; a ring over a bound weighs two workers over a rack's room. */
const DEFECT_WEIGHT = 1_000_000;
const RING_WEIGHT = 2;

/**
 * A valid plan fast, not the fewest moves: the planner's first answer when an event is too hard
 * to prove in its first slice, so that it always has a plan to improve and to return.
 *
 * Local search over counts. Each step takes the rack furthest over its bound (or the fullest
 * rack of the pod furthest over, or else the rack furthest over its room) and one group on it
 * that adds rings there (any movable group, for a rack over its room). All of that group's
 * workers on one rack, a piece, move off the rack or onto it from another, or swap with
 * workers of another movable group where they land: where the cluster is full, swaps are the
 * only way, and where no single swap fits, a piece may land on a full rack for a step, whose
 * overflow the next steps move on (an ejection chain). The step taken leaves the fewest
 * defects, then the fewest moves from the start, even when that is more defects than before;
 * a group may not return to a rack it left for a few steps, so the search does not undo
 * itself. Pinned groups, and workers on unavailable hosts, never move.
 *
 * @returns the counts of a valid placement, or `undefined` when its steps or trials ran out,
 *   or the deadline passed, first.
 */
export function repair(state: CountState, steps = REPAIR_STEPS, trials = REPAIR_TRIALS, deadline = Number.POSITIVE_INFINITY): Counts | undefined {
  const tabu = new Map<number, number>();
  const budget = new Budget(trials, deadline);
  for (let step = 0; step < steps && !state.valid && !budget.spent(); step++) {
    const problem = worstRack(state);
    if (problem === undefined) return undefined;
    const best = bestStep(state, problem, (group, rack) => (tabu.get(group * state.racks + rack) ?? -1) >= step, budget);
    if (!best) return undefined;
    apply(state, best);
    for (const shift of best) tabu.set(shift.group * state.racks + shift.from, step + TABU_STEPS);
  }
  return state.valid ? Int32Array.from(state.count) : undefined;
}

/** Trials left, and the time by which the planner needs its answer whatever the trials say. */
class Budget {
  constructor(
    private trials: number,
    private readonly deadline: number,
  ) {}

  take(): void {
    this.trials -= 1;
  }

  spent(): boolean {
    return this.trials <= 0 || performance.now() >= this.deadline;
  }
}

/** `count` workers of `group` from rack `from` to rack `to`. */
interface Shift {
  readonly group: number;
  readonly from: number;
  readonly to: number;
  readonly count: number;
}

/** Shifts taken together: a move, a swap (two), or a move onto a full rack and what leaves it. */
type Step = readonly Shift[];

/** A rack to mend: over its fragmentation bound (or in a pod over its), or over its room. */
interface Problem {
  readonly rack: number;
  readonly kind: "bound" | "room";
}

function worstRack(state: CountState): Problem | undefined {
  const rack = worst(state.overRackSet, (t) => state.frag[t]! - state.bound[t]!);
  if (rack !== undefined) return { rack, kind: "bound" };
  const pod = worst(state.overPodSet, (p) => state.podFrag[p]! - state.podBound[p]!);
  if (pod !== undefined) {
    // The pod's rack with the most fragmented rings carries the most of what spans it.
    let pick = -1;
    for (let t = 0; t < state.racks; t++) if (state.podOf[t] === pod && (pick === -1 || state.frag[t]! > state.frag[pick]!)) pick = t;
    return { rack: pick, kind: "bound" };
  }
  const full = worst(state.fullRackSet, (t) => state.occupancy[t]! - state.room[t]!);
  return full === undefined ? undefined : { rack: full, kind: "room" };
}

function worst(set: IndexSet, over: (i: number) => number): number | undefined {
  let pick: number | undefined;
  for (let i = 0; i < set.size; i++) {
    const item = set.items[i]!;
    if (pick === undefined || over(item) > over(pick)) pick = item;
  }
  return pick;
}

type IsTabu = (group: number, rack: number) => boolean;

function bestStep(state: CountState, problem: Problem, isTabu: IsTabu, budget: Budget): Step | undefined {
  let best: Step | undefined;
  let bestScore = Number.POSITIVE_INFINITY;
  // Racks with a free host: the only ones a chain's last link may end on.
  const roomy: number[] = [];
  for (let t = 0; t < state.racks; t++) if (state.occupancy[t]! < state.room[t]!) roomy.push(t);
  const consider = (step: Step) => {
    if (budget.spent()) return;
    budget.take();
    const cells = touched(state, step);
    const before = lost(state, cells);
    apply(state, step);
    const score = DEFECT_WEIGHT * defects(state) + lost(state, cells) - before;
    undo(state, step);
    if (score < bestScore) {
      bestScore = score;
      best = step;
    }
  };
  const { rack } = problem;
  for (const group of members(state.groupsOn[rack]!)) {
    if (!state.movable[group]) continue;
    if (problem.kind === "room") {
      // The overflow alone, or the whole piece.
      const pieces = movableOn(state, group, rack);
      const sizes = new Set([Math.min(pieces, state.occupancy[rack]! - state.room[rack]!), pieces]);
      for (const count of sizes)
        for (let to = 0; to < state.racks && !budget.spent(); to++)
          if (to !== rack && count > 0 && !isTabu(group, to)) landings(state, { group, from: rack, to, count }, isTabu, roomy, consider);
      continue;
    }
    if (!spans(state, group)) continue;
    // A rack sheds a group's rings when the group leaves it or gathers whole on it: its piece
    // here goes anywhere, or a piece elsewhere comes here.
    for (let from = 0; from < state.racks && !budget.spent(); from++) {
      const count = movableOn(state, group, from);
      if (count === 0) continue;
      if (from !== rack) {
        if (!isTabu(group, rack)) landings(state, { group, from, to: rack, count }, isTabu, roomy, consider);
        continue;
      }
      for (let to = 0; to < state.racks && !budget.spent(); to++)
        if (to !== rack && !isTabu(group, to)) landings(state, { group, from, to, count }, isTabu, roomy, consider);
    }
  }
  return best;
}

/**
 * A shift as a move (onto a full rack too), its swaps with each movable group where it lands,
 * and, where it overflows that rack, the overflow or a whole piece of another group moving on
 * to a rack with room: one link of an ejection chain, judged with it.
 */
function landings(state: CountState, shift: Shift, isTabu: IsTabu, roomy: readonly number[], consider: (step: Step) => void): void {
  const { group, from, to, count } = shift;
  consider([shift]);
  const free = Math.max(0, state.room[to]! - state.occupancy[to]!);
  const roomFrom = count + Math.max(0, state.room[from]! - state.occupancy[from]!);
  const overflow = count - free;
  for (const other of members(state.groupsOn[to]!)) {
    if (other === group || !state.movable[other]) continue;
    const there = movableOn(state, other, to);
    if (!isTabu(other, from)) {
      for (let back = Math.max(1, overflow); back <= Math.min(there, roomFrom); back++) consider([shift, { group: other, from: to, to: from, count: back }]);
    }
    if (overflow <= 0) continue;
    for (const moved of new Set([Math.min(there, overflow), there])) {
      for (const onward of roomy) {
        if (onward === to || onward === from || isTabu(other, onward)) continue;
        if (state.room[onward]! - state.occupancy[onward]! >= moved) consider([shift, { group: other, from: to, to: onward, count: moved }]);
      }
    }
  }
}

const members = (set: IndexSet): number[] => Array.from(set.items.subarray(0, set.size));

/** Whether the group adds its rings somewhere: it spans racks, or pods where pods are bounded. */
function spans(state: CountState, group: number): boolean {
  return state.spread[group]! >= 2 || (state.pods > 0 && state.podSpread[group]! >= 2);
}

/** Workers of `group` on `rack` that may leave it: those on unavailable hosts stay. */
function movableOn(state: CountState, group: number, rack: number): number {
  const cell = group * state.racks + rack;
  return state.count[cell]! - state.heldAt(cell);
}

function apply(state: CountState, step: Step): void {
  for (const { group, from, to, count } of step) for (let i = 0; i < count; i++) state.move(group, from, to);
}

function undo(state: CountState, step: Step): void {
  for (let s = step.length - 1; s >= 0; s--) {
    const { group, from, to, count } = step[s]!;
    for (let i = 0; i < count; i++) state.move(group, to, from);
  }
}

/** Rings over the bounds, racks and pods, and workers over racks' room, weighted. */
function defects(state: CountState): number {
  const rings = excess(state.overRackSet, state.frag, state.bound) + excess(state.overPodSet, state.podFrag, state.podBound);
  return RING_WEIGHT * rings + excess(state.fullRackSet, state.occupancy, state.room);
}

/** How far the set's items stand over their limits, in all; read in place, as it runs per trial. */
function excess(set: IndexSet, value: ArrayLike<number>, limit: ArrayLike<number>): number {
  let sum = 0;
  for (let i = 0; i < set.size; i++) {
    const item = set.items[i]!;
    sum += value[item]! - limit[item]!;
  }
  return sum;
}

/** The (group, rack) cells a step changes, each once. */
function touched(state: CountState, step: Step): number[] {
  const cells = new Set<number>();
  for (const { group, from, to } of step) cells.add(group * state.racks + from).add(group * state.racks + to);
  return [...cells];
}

/**
 * Workers gone from where they started, over the cells a step touches: the step's change of
 * this is its change of the plan's moves.
 */
function lost(state: CountState, cells: readonly number[]): number {
  let gone = 0;
  for (const cell of cells) gone += Math.max(0, state.initial[cell]! - state.count[cell]!);
  return gone;
}
