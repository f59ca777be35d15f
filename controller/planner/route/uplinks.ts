import type { BipartiteMultigraph, EdgeColouring } from "./edge-colouring.ts";
import type { RackLoad } from "./schema.ts";

/**
 * From colours to physical links. With Δ ≤ uplinks a colour is an uplink (and the spine, or
 * aggregation switch, behind it). With Δ > uplinks, as when routing a fragmented cluster
 * without migrating, colours are folded onto uplinks round-robin (colour mod uplinks) and the
 * fold is then evened out at every rack: for each uplink pair (i, j) unbalanced at some vertex,
 * the edges on i or j are split into trails and recoloured alternately, which leaves every
 * vertex within one of even on i and j (de Werra's balancing; bipartite graphs make closed
 * trails even). Repeating until no vertex is unbalanced ends with each rack carrying
 * ⌈d/uplinks⌉ or ⌊d/uplinks⌋ flows on each uplink, where d is its flow count — so no link
 * carries more than ⌈Δ/uplinks⌉.
 */
export function foldColours(graph: BipartiteMultigraph, colouring: EdgeColouring, slots: number): Int32Array {
  if (!(Number.isInteger(slots) && slots >= 1)) throw new RangeError(`slots must be a whole number ≥ 1, got ${slots}`);
  const folded = colouring.colours.map((c) => c % slots);
  if (colouring.count > slots) balance(graph, folded, slots);
  return folded;
}

function balance(graph: BipartiteMultigraph, slot: Int32Array, slots: number): void {
  const vertices = graph.left + graph.right;
  const endsOf = (e: number): [number, number] => [graph.from[e] as number, graph.left + (graph.to[e] as number)];
  const count = new Int32Array(vertices * slots);
  for (let e = 0; e < slot.length; e++) for (const x of endsOf(e)) count[x * slots + slot[e]!]!++;

  let changed = true;
  while (changed) {
    changed = false;
    for (let x = 0; x < vertices; x++) {
      let most = 0;
      let least = 0;
      for (let s = 1; s < slots; s++) {
        if (count[x * slots + s]! > count[x * slots + most]!) most = s;
        if (count[x * slots + s]! < count[x * slots + least]!) least = s;
      }
      if (count[x * slots + most]! - count[x * slots + least]! >= 2) {
        evenPair(most, least);
        changed = true;
      }
    }
  }

  function evenPair(i: number, j: number): void {
    const edges: number[] = [];
    for (let e = 0; e < slot.length; e++) if (slot[e] === i || slot[e] === j) edges.push(e);
    const incident: number[][] = Array.from({ length: vertices }, () => []);
    for (const e of edges) for (const x of endsOf(e)) incident[x]!.push(e);
    const remaining = incident.map((list) => list.length);
    const cursor = new Int32Array(vertices);
    const used = new Set<number>();
    for (const e of edges) for (const x of endsOf(e)) count[x * slots + slot[e]!]!--;

    const walk = (start: number): void => {
      let x = start;
      let colour = i;
      for (;;) {
        const list = incident[x]!;
        while (cursor[x]! < list.length && used.has(list[cursor[x]!]!)) cursor[x]!++;
        const e = list[cursor[x]!];
        if (e === undefined) return;
        used.add(e);
        slot[e] = colour;
        const [u, v] = endsOf(e);
        remaining[u]!--;
        remaining[v]!--;
        count[u * slots + colour]!++;
        count[v * slots + colour]!++;
        x = x === u ? v : u;
        colour = colour === i ? j : i;
      }
    };
    // Open trails first, from vertices of odd degree, so each such vertex ends exactly one.
    for (let x = 0; x < vertices; x++) if (remaining[x]! % 2 === 1) walk(x);
    for (let x = 0; x < vertices; x++) if (remaining[x]! > 0) walk(x);
  }
}

/** A flow already routed: where it leaves its source rack and enters its destination rack. */
export interface RackHop {
  readonly srcRack: number;
  readonly dstRack: number;
  readonly uplink: number;
  readonly downlink: number;
}

/** Per-rack flow counts and the heaviest uplink and downlink, from routed flows. */
export function rackLoads(racks: number, uplinks: number, flows: readonly RackHop[]): RackLoad[] {
  const up = new Int32Array(racks * uplinks);
  const down = new Int32Array(racks * uplinks);
  for (const f of flows) {
    up[f.srcRack * uplinks + f.uplink]!++;
    down[f.dstRack * uplinks + f.downlink]!++;
  }
  return Array.from({ length: racks }, (_, rack) => {
    const ups = up.subarray(rack * uplinks, (rack + 1) * uplinks);
    const downs = down.subarray(rack * uplinks, (rack + 1) * uplinks);
    return {
      rack,
      flowsOut: ups.reduce((a, b) => a + b, 0),
      flowsIn: downs.reduce((a, b) => a + b, 0),
      uplinks,
      maxFlowsPerUplink: ups.reduce((a, b) => Math.max(a, b), 0),
      maxFlowsPerDownlink: downs.reduce((a, b) => Math.max(a, b), 0),
    };
  });
}

/**
 * Round-robin over a switch's links, one counter per switch. Pipeline flows are small (paper
 * §5.3), so they are spread evenly rather than isolated.
 */
export class RoundRobin {
  private readonly next = new Map<string, number>();
  constructor(private readonly links: number) {}

  take(switchKey: string): number {
    const n = this.next.get(switchKey) ?? 0;
    this.next.set(switchKey, n + 1);
    return n % this.links;
  }
}
