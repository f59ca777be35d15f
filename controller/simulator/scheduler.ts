import type { Random } from "./random.ts";

/**
 * The paper's locality-aware, Slurm-like cluster scheduler (§6.1): if one rack can hold the
 * whole job, it goes on the rack with the fewest free hosts that can; otherwise the rack with
 * the most free hosts takes as much of the job as it can, then the next roomiest, and so on.
 * The paper's text places the rest "recursively", which could also read as the fullest rack
 * that holds it; the artifact's scheduler keeps taking the roomiest, and so does this one.
 * Within a rack the lowest free host index goes first; ties between racks go to the lowest rack.
 * This is the scheduler that MonkeyTree sits behind, not part of MonkeyTree: it is what makes
 * the fragmentation the planner has to repair.
 *
 * @param occupied `occupied[h]` is true when global host `h` runs a worker.
 * @param stageSizes hosts of each group, in stage order; hosts are handed out stage by stage.
 * @returns the hosts of every group, or `undefined` when the cluster has too few free hosts.
 */
export function bestFit(occupied: readonly boolean[], hostsPerRack: number, stageSizes: readonly number[]): number[][] | undefined {
  const free = freeHostsByRack(occupied, hostsPerRack);
  let remaining = stageSizes.reduce((sum, size) => sum + size, 0);
  if (remaining > free.reduce((sum, hosts) => sum + hosts.length, 0)) return undefined;
  const chosen: number[] = [];
  const fit = tightestFit(free, remaining);
  while (remaining > 0) {
    const rack = fit ?? roomiest(free);
    const hosts = free[rack] ?? [];
    const taken = hosts.splice(0, Math.min(remaining, hosts.length));
    chosen.push(...taken);
    remaining -= taken.length;
  }
  let next = 0;
  return stageSizes.map((size) => chosen.slice(next, (next += size)));
}

function freeHostsByRack(occupied: readonly boolean[], hostsPerRack: number): number[][] {
  const racks = Math.ceil(occupied.length / hostsPerRack);
  const free = Array.from({ length: racks }, () => [] as number[]);
  occupied.forEach((busy, host) => {
    if (!busy) free[Math.floor(host / hostsPerRack)]?.push(host);
  });
  return free;
}

/** The rack with the fewest free hosts that still has `needed`, if any. */
function tightestFit(free: readonly (readonly number[])[], needed: number): number | undefined {
  let best: number | undefined;
  free.forEach((hosts, rack) => {
    if (hosts.length >= needed && (best === undefined || hosts.length < (free[best]?.length ?? 0))) best = rack;
  });
  return best;
}

function roomiest(free: readonly (readonly number[])[]): number {
  let best = 0;
  free.forEach((hosts, rack) => {
    if (hosts.length > (free[best]?.length ?? 0)) best = rack;
  });
  return best;
}

/**
 * The paper's FIFO front-end (§7.9): free hosts scanned left to right, lowest index first,
 * with no regard for racks.
 */
export function firstFree(occupied: readonly boolean[], _hostsPerRack: number, stageSizes: readonly number[]): number[][] | undefined {
  return splitFree(
    occupied.flatMap((busy, host) => (busy ? [] : [host])),
    stageSizes,
  );
}

/** The paper's Random front-end (§7.9): free hosts drawn uniformly at random. */
export function randomFree(random: Random): Scheduler {
  return (occupied, _hostsPerRack, stageSizes) => {
    const free = occupied.flatMap((busy, host) => (busy ? [] : [host]));
    // Partial Fisher–Yates: only the hosts handed out are drawn.
    const needed = Math.min(
      free.length,
      stageSizes.reduce((sum, size) => sum + size, 0),
    );
    for (let i = 0; i < needed; i++) {
      const j = random.int(i, free.length - 1);
      [free[i], free[j]] = [free[j]!, free[i]!];
    }
    return splitFree(free, stageSizes);
  };
}

/** Places a job's stages on free hosts; `undefined` when too few are free. */
export type Scheduler = (occupied: readonly boolean[], hostsPerRack: number, stageSizes: readonly number[]) => number[][] | undefined;

export const SCHEDULERS = ["best-fit", "fifo", "random"] as const;
export type SchedulerName = (typeof SCHEDULERS)[number];

export function scheduler(name: SchedulerName, random: Random): Scheduler {
  switch (name) {
    case "best-fit":
      return bestFit;
    case "fifo":
      return firstFree;
    case "random":
      return randomFree(random);
  }
}

function splitFree(free: readonly number[], stageSizes: readonly number[]): number[][] | undefined {
  const total = stageSizes.reduce((sum, size) => sum + size, 0);
  if (total > free.length) return undefined;
  let next = 0;
  return stageSizes.map((size) => free.slice(next, (next += size)));
}
