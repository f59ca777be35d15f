import { rackOf, type Cluster } from "../model/cluster.ts";
import type { Counts } from "./counts.ts";
import type { Move } from "./schema.ts";

/**
 * Turns target worker counts per (group, rack) into concrete host moves.
 *
 * Workers leave from the highest-numbered hosts of their group on a rack, so the low hosts of
 * a long-running job stay put, and from unavailable hosts last, since nobody may take those
 * back (`CountState.held`). Arrivals take the rack's free available hosts first and only then
 * available hosts vacated by other moves, so as few destinations as possible wait on another worker's
 * checkpoint. All moves form one step: every source of a step stages into destination DRAM
 * before any destination loads, so chains, swaps and cycles need no free host in between, and
 * target counts within rack capacity always fit.
 */
export function hostMoves(cluster: Cluster, target: Counts): Move[] {
  const { racks, hostsPerRack } = cluster.topology;
  const owner = new Int32Array(cluster.hostCount).fill(-1);
  cluster.placement.forEach((hosts, g) => hosts.forEach((h) => (owner[h] = g)));
  const unavailable = new Set(cluster.unavailable);
  // Each group's hosts by rack, once: the plan touches few of the groups × racks cells.
  const onRack = cluster.placement.map((hosts) => {
    const byRack = new Map<number, number[]>();
    for (const h of hosts) {
      const t = rackOf(cluster, h);
      const list = byRack.get(t);
      if (list) list.push(h);
      else byRack.set(t, [h]);
    }
    return byRack;
  });
  const leaving: number[][] = cluster.groups.map(() => []);
  const vacated: number[][] = Array.from({ length: racks }, () => []);

  onRack.forEach((byRack, g) => {
    for (const [t, hosts] of byRack) {
      const surplus = hosts.length - target[g * racks + t]!;
      if (surplus <= 0) continue;
      const gone = [...hosts].sort((a, b) => Number(unavailable.has(a)) - Number(unavailable.has(b)) || b - a).slice(0, surplus);
      leaving[g]!.push(...gone);
      vacated[t]!.push(...gone);
    }
  });

  const arrivals: number[][] = Array.from({ length: racks }, (_, t) => {
    const first = t * hostsPerRack;
    const free = Array.from({ length: hostsPerRack }, (_, i) => first + i).filter((h) => owner[h] === -1);
    return [...free, ...vacated[t]!.sort((a, b) => a - b)].filter((h) => !unavailable.has(h));
  });

  const moves: Move[] = [];
  cluster.groups.forEach((group, g) => {
    const sources = leaving[g]!.sort((a, b) => a - b);
    if (sources.length === 0) return;
    let next = 0;
    for (let t = 0; t < racks; t++) {
      for (let k = onRack[g]!.get(t)?.length ?? 0; k < target[g * racks + t]!; k++) {
        const from = sources[next++]!;
        const to = arrivals[t]!.shift()!;
        moves.push({ job: group.job, group: group.index, from, to, step: 0 });
      }
    }
  });
  return moves.sort((a, b) => a.step - b.step || a.from - b.from);
}
