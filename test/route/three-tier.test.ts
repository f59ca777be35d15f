import { describe, expect, it } from "vitest";
import { podFragmentation, podOfRack, rackFragmentation } from "../../controller/planner/model/index.ts";
import { defaultAddressOf, ROCE_V2_PORT, routeCluster, type Routes } from "../../controller/planner/route/index.ts";
import { referenceHop } from "./reference-hash.ts";
import { syntheticCluster, type SyntheticShape } from "../../controller/simulator/synthetic.ts";

const shapes: SyntheticShape[] = [
  { racks: 16, hostsPerRack: 4, uplinksPerRack: 8, rings: 2, racksPerPod: 4, podLambda: 16, maxSpan: 6 },
  // More racks per pod than aggregation switches: the pod boundary, not the racks, limits.
  { racks: 24, hostsPerRack: 4, uplinksPerRack: 2, rings: 1, racksPerPod: 12, podLambda: 4, maxSpan: 5 },
  // One flow per rack but up to U² per pod: the colour budget, not rack degree, sets the copies.
  { racks: 24, hostsPerRack: 4, uplinksPerRack: 2, rings: 1, racksPerPod: 12, lambda: 1, podLambda: 4, maxSpan: 5 },
  { racks: 8, hostsPerRack: 8, uplinksPerRack: 4, rings: 4, racksPerPod: 2, podLambda: 16, maxSpan: 4 },
];

/** Load on every physical link a DP flow crosses, keyed by the link, counted from the records. */
function physicalLoads(routes: Routes, podOf: (rack: number) => number): Map<string, number> {
  const load = new Map<string, number>();
  const add = (link: string) => load.set(link, (load.get(link) ?? 0) + 1);
  for (const f of routes.dpFlows) {
    add(`rack ${f.srcRack} → agg ${podOf(f.srcRack)}.${f.uplink}`);
    add(`agg ${podOf(f.dstRack)}.${f.downlink} → rack ${f.dstRack}`);
    if (f.core !== null) {
      add(`agg ${podOf(f.srcRack)}.${f.uplink} → core ${f.core}`);
      add(`core ${f.core} → agg ${podOf(f.dstRack)}.${f.downlink}`);
    }
  }
  return load;
}

describe("Perfect routing in a 3-tier Clos", () => {
  it("isolates DP flows on every rack, aggregation and core link when racks and pods are within bounds", () => {
    let interPod = 0;
    shapes.forEach((shape, s) => {
      for (let seed = 1; seed <= 25; seed++) {
        const cluster = syntheticCluster(shape, seed);
        const label = `shape ${s} seed ${seed}`;
        const routes = routeCluster(cluster);
        const podOf = (rack: number) => podOfRack(cluster, rack);
        const load = physicalLoads(routes, podOf);
        expect(Math.max(0, ...load.values()), label).toBeLessThanOrEqual(1);
        expect(routes.isolated, label).toBe(true);
        expect(routes.tiers).toBe(3);
        for (const f of routes.dpFlows) {
          const crosses = podOf(f.srcRack) !== podOf(f.dstRack);
          expect(f.core !== null, label).toBe(crosses);
          // Inside a pod the aggregation switch reached by the uplink is the one sending down.
          if (!crosses) expect(f.downlink, label).toBe(f.uplink);
          interPod += crosses ? 1 : 0;
        }
        expect(
          routes.racks.map((r) => r.flowsOut),
          label,
        ).toEqual(rackFragmentation(cluster));
        expect(
          routes.pods.map((p) => p.flowsOut),
          label,
        ).toEqual(podFragmentation(cluster));
      }
    });
    expect(interPod).toBeGreaterThan(500);
  });

  it.each([
    ["8 uplinks: every path has ports", shapes[0]!, 5],
    // 32³ paths but 2^14 ports: core switches are moved to ones the port space reaches.
    ["32 uplinks: more paths than ports", { racks: 8, hostsPerRack: 8, uplinksPerRack: 32, rings: 8, racksPerPod: 2, podLambda: 64, maxSpan: 4 }, 3],
  ] as const)("steers inter-pod flows through all three ECMP choices (%s)", (_, shape, seeds) => {
    const links = shape.uplinksPerRack;
    let interPod = 0;
    for (let seed = 1; seed <= seeds; seed++) {
      const cluster = syntheticCluster(shape, seed);
      const routes = routeCluster(cluster);
      expect(routes.unsteered).toBe(0);
      expect(routes.isolated).toBe(true);
      expect(Math.max(0, ...physicalLoads(routes, (rack) => podOfRack(cluster, rack)).values())).toBeLessThanOrEqual(1);
      for (const f of [...routes.dpFlows, ...routes.ppFlows]) {
        const tuple = {
          srcAddress: defaultAddressOf(f.srcHost),
          dstAddress: defaultAddressOf(f.dstHost),
          protocol: 17,
          srcPort: f.sourcePort!,
          dstPort: ROCE_V2_PORT,
        };
        expect(referenceHop(tuple, links, "tor")).toBe(f.uplink);
        if (f.core === null) continue;
        interPod++;
        expect(referenceHop(tuple, links, "aggregation")).toBe(f.core);
        expect(referenceHop(tuple, links, "core")).toBe(f.downlink);
      }
    }
    expect(interPod).toBeGreaterThan(50);
  });

  it("reports pods whose core links must share when the pod bound exceeds the core capacity", () => {
    // 2 uplinks per rack: each pod has 2 × 2 core-facing links, fewer than its inter-pod flows.
    const shape: SyntheticShape = { racks: 16, hostsPerRack: 4, uplinksPerRack: 2, rings: 1, racksPerPod: 8, lambda: 2, podLambda: 8, maxSpan: 2 };
    let shared = 0;
    for (let seed = 1; seed <= 20; seed++) {
      const cluster = syntheticCluster(shape, seed);
      const routes = routeCluster(cluster);
      const load = physicalLoads(routes, (rack) => podOfRack(cluster, rack));
      const worst = Math.max(0, ...load.values());
      expect(routes.overlap.maxFlowsPerLink).toBe(worst);
      expect(routes.isolated).toBe(worst <= 1);
      const crowded = routes.pods.filter((p) => p.flowsOut > 4 || p.flowsIn > 4).map((p) => p.pod);
      for (const pod of crowded) expect(routes.overlap.pods).toContain(pod);
      shared += crowded.length;
    }
    expect(shared).toBeGreaterThan(0);
  });
});
