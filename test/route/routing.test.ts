import { describe, expect, it } from "vitest";
import { rackFragmentation, rackOf, type Cluster } from "../../controller/planner/model/index.ts";
import { colourByRegularMatchings, isContiguous, routeCluster, type Routes } from "../../controller/planner/route/index.ts";
import { syntheticCluster, type SyntheticShape } from "../../controller/simulator/synthetic.ts";

const shapes: SyntheticShape[] = [
  { racks: 4, hostsPerRack: 4, uplinksPerRack: 2, rings: 1 },
  { racks: 8, hostsPerRack: 4, uplinksPerRack: 4, rings: 2 },
  { racks: 16, hostsPerRack: 8, uplinksPerRack: 16, rings: 8, maxSpan: 6 },
  { racks: 12, hostsPerRack: 2, uplinksPerRack: 3, rings: 1, lambda: 2 },
];

/** Load of every rack uplink and downlink, counted from the flow records alone. */
function linkLoads(routes: Routes): { up: Map<string, number>; down: Map<string, number> } {
  const up = new Map<string, number>();
  const down = new Map<string, number>();
  for (const f of routes.dpFlows) {
    const u = `${f.srcRack}/${f.uplink}`;
    const d = `${f.dstRack}/${f.downlink}`;
    up.set(u, (up.get(u) ?? 0) + 1);
    down.set(d, (down.get(d) ?? 0) + 1);
  }
  return { up, down };
}

const maxOf = (m: Map<string, number>) => Math.max(0, ...m.values());

function eachCluster(check: (cluster: Cluster, label: string) => void): void {
  shapes.forEach((shape, s) => {
    for (let seed = 1; seed <= 25; seed++) check(syntheticCluster(shape, seed), `shape ${s} seed ${seed}`);
  });
}

describe("Perfect routing in a 2-tier Clos", () => {
  it("gives every DP flow its own uplink and downlink when racks are within bounds", () => {
    eachCluster((cluster, label) => {
      for (const colour of [undefined, colourByRegularMatchings]) {
        const routes = routeCluster(cluster, colour ? { colour } : {});
        const { up, down } = linkLoads(routes);
        expect(maxOf(up), label).toBeLessThanOrEqual(1);
        expect(maxOf(down), label).toBeLessThanOrEqual(1);
        expect(routes.isolated, label).toBe(true);
        expect(routes.folded, label).toBe(false);
        expect(routes.delta, label).toBeLessThanOrEqual(cluster.topology.uplinksPerRack);
        for (const f of routes.dpFlows) {
          // One spine per flow: out of the source rack's uplink c, into the destination's downlink c.
          expect(f.spine).toBe(f.uplink);
          expect(f.downlink).toBe(f.uplink);
          expect(f.core).toBeNull();
        }
      }
    });
  });

  it("sends and receives exactly as many DP flows per rack as its fragmentation degree", () => {
    eachCluster((cluster, label) => {
      const routes = routeCluster(cluster);
      const degree = rackFragmentation(cluster);
      expect(
        routes.racks.map((r) => r.flowsOut),
        label,
      ).toEqual(degree);
      expect(
        routes.racks.map((r) => r.flowsIn),
        label,
      ).toEqual(degree);
      expect(routes.delta, label).toBe(Math.max(0, ...degree));
    });
  });

  it("is deterministic", () => {
    const cluster = syntheticCluster(shapes[2]!, 7);
    expect(routeCluster(cluster)).toEqual(routeCluster(cluster));
  });

  it("spreads pipeline flows round-robin over each rack's uplinks", () => {
    eachCluster((cluster, label) => {
      const routes = routeCluster(cluster);
      const perRack = new Map<number, number[]>();
      for (const f of routes.ppFlows) {
        const counts = perRack.get(f.srcRack) ?? new Array<number>(cluster.topology.uplinksPerRack).fill(0);
        counts[f.uplink]! += 1;
        perRack.set(f.srcRack, counts);
        expect(rackOf(cluster, f.srcHost)).toBe(f.srcRack);
        expect(f.srcRack).not.toBe(f.dstRack);
      }
      for (const counts of perRack.values()) expect(Math.max(...counts) - Math.min(...counts), label).toBeLessThanOrEqual(1);
    });
  });
});

describe("folding colours onto fewer uplinks", () => {
  // Bounds far above the uplinks: a fragmented cluster routed without migration.
  const over: SyntheticShape[] = [
    { racks: 8, hostsPerRack: 8, uplinksPerRack: 2, rings: 2, lambda: 12, maxSpan: 5 },
    { racks: 12, hostsPerRack: 6, uplinksPerRack: 3, rings: 1, lambda: 10, maxSpan: 6 },
    { racks: 16, hostsPerRack: 8, uplinksPerRack: 4, rings: 4, lambda: 24, maxSpan: 8 },
  ];

  it("keeps every rack's uplinks even: ⌈flows/uplinks⌉ at most on any one", () => {
    let foldedSeen = 0;
    over.forEach((shape, s) => {
      for (let seed = 1; seed <= 20; seed++) {
        const cluster = syntheticCluster(shape, seed);
        const routes = routeCluster(cluster);
        const links = cluster.topology.uplinksPerRack;
        const label = `shape ${s} seed ${seed}`;
        if (!routes.folded) continue;
        foldedSeen++;
        const { up, down } = linkLoads(routes);
        expect(Math.max(maxOf(up), maxOf(down)), label).toBe(Math.ceil(routes.delta / links));
        expect(routes.overlap.maxFlowsPerLink, label).toBe(Math.ceil(routes.delta / links));
        for (const r of routes.racks) {
          expect(r.maxFlowsPerUplink, `${label} rack ${r.rack}`).toBe(Math.ceil(r.flowsOut / links));
          expect(r.maxFlowsPerDownlink, `${label} rack ${r.rack}`).toBe(Math.ceil(r.flowsIn / links));
        }
        expect(routes.overlap.racks, label).toEqual(routes.racks.filter((r) => r.flowsOut > links || r.flowsIn > links).map((r) => r.rack));
        expect(routes.isolated, label).toBe(false);
      }
    });
    expect(foldedSeen).toBeGreaterThan(30);
  });
});

describe("ring orders", () => {
  it("keep each rack's hosts contiguous and hold every host of the group once", () => {
    eachCluster((cluster, label) => {
      const routes = routeCluster(cluster);
      routes.ringOrders.forEach(({ order }, g) => {
        expect(isContiguous(cluster, order), label).toBe(true);
        expect(
          [...order].sort((a, b) => a - b),
          label,
        ).toEqual([...cluster.placement[g]!].sort((a, b) => a - b));
      });
    });
  });

  it("keep an unchanged group's order exactly, even when it is not in host order", () => {
    const cluster = syntheticCluster(shapes[1]!, 3);
    // Reverse every group's order, racks stay contiguous.
    const previous = routeCluster(cluster).ringOrders.map(({ order }) => [...order].reverse());
    expect(routeCluster(cluster, { previousOrders: previous }).ringOrders.map((r) => r.order)).toEqual(previous);
  });

  it("keep surviving hosts in their previous relative order when a group changes", () => {
    eachCluster((cluster, label) => {
      const before = routeCluster(cluster).ringOrders.map(({ order }) => [...order].reverse());
      // Every group loses its first host and gains the lowest free host, wherever that is.
      const taken = new Set(cluster.placement.flat());
      const changed = cluster.placement.map((hosts) => {
        const extra = Array.from({ length: cluster.hostCount }, (_, h) => h).find((h) => !taken.has(h));
        if (extra !== undefined) taken.add(extra);
        return [...hosts.slice(1), ...(extra === undefined ? [] : [extra])];
      });
      const moved = { ...cluster, placement: changed };
      const after = routeCluster(moved, { previousOrders: before }).ringOrders;
      after.forEach(({ order }, g) => {
        const survivors = new Set(changed[g]);
        const kept = before[g]!.filter((h) => survivors.has(h));
        expect(
          order.filter((h) => kept.includes(h)),
          label,
        ).toEqual(kept);
        expect(isContiguous(moved, order), label).toBe(true);
      });
    });
  });
});
