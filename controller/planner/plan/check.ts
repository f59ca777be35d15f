import type { Cluster, Placement } from "../model/cluster.ts";
import type { Move } from "./schema.ts";

/** A plan that breaks the plan contract; raised by `applyMoves`. */
export class PlanError extends Error {
  override readonly name = "PlanError";
  readonly code = "invalid_plan";
}

/**
 * Applies a plan step by step and returns the final placement, enforcing the plan contract:
 * every move's source runs a worker of that job's group when its step starts; every
 * destination is free when its step starts or is vacated by another move of the same step;
 * no host receives two workers; no move is of a pinned job (`movable: false`) or lands on an
 * unavailable host.
 */
export function applyMoves(cluster: Cluster, moves: readonly Move[]): Placement {
  const owner = new Map<number, number>();
  cluster.placement.forEach((hosts, g) => hosts.forEach((h) => owner.set(h, g)));
  const unavailable = new Set(cluster.unavailable);
  const groupIndex = new Map(cluster.groups.map((group, g) => [`${group.job}\u0000${group.index}`, g]));
  const steps = [...new Set(moves.map((m) => m.step))].sort((a, b) => a - b);
  for (const step of steps) {
    const batch = moves.filter((m) => m.step === step);
    const leaving = new Set<number>();
    const arriving = new Set<number>();
    for (const move of batch) {
      const g = groupIndex.get(`${move.job}\u0000${move.group}`);
      const where = `step ${step}, move ${move.job}[${move.group}] ${move.from}→${move.to}`;
      if (g === undefined) throw new PlanError(`${where}: no such job group`);
      if (move.to < 0 || move.to >= cluster.hostCount) throw new PlanError(`${where}: destination out of range`);
      if (!cluster.groups[g]!.movable) throw new PlanError(`${where}: job "${move.job}" is pinned (movable: false)`);
      if (unavailable.has(move.to)) throw new PlanError(`${where}: the destination is unavailable`);
      if (owner.get(move.from) !== g) throw new PlanError(`${where}: the source does not run this group`);
      if (leaving.has(move.from)) throw new PlanError(`${where}: the source moves twice in one step`);
      if (arriving.has(move.to)) throw new PlanError(`${where}: the destination receives two workers`);
      leaving.add(move.from);
      arriving.add(move.to);
    }
    for (const move of batch) {
      if (owner.has(move.to) && !leaving.has(move.to)) {
        throw new PlanError(`step ${step}, move ${move.job}[${move.group}] ${move.from}→${move.to}: the destination is busy and not vacated in this step`);
      }
    }
    const landed = batch.map((move) => [move.to, owner.get(move.from)!] as const);
    for (const move of batch) owner.delete(move.from);
    for (const [host, g] of landed) owner.set(host, g);
  }
  const placement: number[][] = cluster.groups.map(() => []);
  for (const [host, g] of [...owner].sort((a, b) => a[0] - b[0])) placement[g]!.push(host);
  return placement;
}
