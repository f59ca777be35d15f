import { beforeAll, describe, expect, it } from "vitest";
import { clusterFromSnapshot, type Cluster } from "../../controller/planner/model/cluster.ts";
import { podFragmentation, rackFragmentation } from "../../controller/planner/model/fragmentation.ts";
import { applyMoves, createPlanner, type Planner } from "../../controller/planner/plan/index.ts";
import { dpFlows, ppFlows } from "../../controller/planner/route/index.ts";
import { Fabric, FabricSchema, type FabricShape } from "../../controller/simulator/fabric.ts";
import { generateJobs, SimJobSchema, type SimJob } from "../../controller/simulator/jobs.ts";
import { PRESETS } from "../../controller/simulator/presets.ts";
import { choosePaths, ecmpSpine, ringRail, type RoutingName } from "../../controller/simulator/routing.ts";
import { simulateSystem, type SimConfigInput, type SystemName } from "../../controller/simulator/simulate.ts";

let planner: Planner;
beforeAll(async () => {
  planner = await createPlanner();
});

/**
 * 2 pods of 2 racks of 2 hosts with 2 GPUs; 4 uplinks per rack, so 4 aggregation switches per
 * pod, each with one core link: a pod has 4 core-facing links for its racks' 8 uplinks.
 */
const clos3: FabricShape = FabricSchema.parse({ racks: 4, hostsPerRack: 2, gpusPerHost: 2, uplinksPerRack: 4, racksPerPod: 2, aggUplinks: 1, nicGbps: 8 });
/** 3 pods of 2 hosts with 2 GPUs; rail r joins GPU r of a pod's hosts and has 1 uplink. */
const rail: FabricShape = FabricSchema.parse({ racks: 3, hostsPerRack: 2, gpusPerHost: 2, uplinksPerRack: 2, uplinksPerRail: 1, nicGbps: 8 });

const clusterOf = (shape: FabricShape, groups: number[][], rings = 2, pods = false): Cluster =>
  clusterFromSnapshot({
    topology: {
      racks: shape.racks,
      hostsPerRack: shape.hostsPerRack,
      gpusPerHost: shape.gpusPerHost,
      uplinksPerRack: shape.uplinksPerRack,
      ...(pods ? { racksPerPod: shape.racksPerPod! } : {}),
    },
    jobs: groups.map((hosts, i) => ({ id: `j${i}`, rings, hosts })),
  });

/** The most DP flows any link carries under a routing, and the links each flow takes. */
function route(name: RoutingName, shape: FabricShape, cluster: Cluster) {
  const fabric = new Fabric(shape, name === "spray");
  const dp = dpFlows(cluster, cluster.placement);
  const pp = ppFlows(cluster, cluster.placement);
  const chosen = choosePaths(name, cluster, dp, pp, [], { fabric, seed: 1, sglbK: 1, intensity: () => 1, share: () => ({ dp: 1, pp: 1 }) });
  const links = dp.map((f, i) => fabric.route(f.srcRack, f.dstRack, ringRail(cluster, f, shape.gpusPerHost), chosen.dp[i]!));
  const load = new Map<number, number>();
  for (const path of links) for (const l of path) load.set(l, (load.get(l) ?? 0) + 1);
  return { fabric, dp, links, chosen, worst: Math.max(0, ...load.values()) };
}

describe("3-tier Clos", () => {
  const fabric = new Fabric(clos3);

  it("routes inside a pod through one aggregation switch, and between pods through a core link", () => {
    expect(fabric.hops(0, 0)).toEqual([]);
    expect(fabric.hops(0, 1)).toEqual([{ tier: "tor", members: 4 }]);
    expect(fabric.hops(1, 2)).toEqual([
      { tier: "tor", members: 4 },
      { tier: "aggregation", members: 1 },
      { tier: "core", members: 4 },
    ]);
    expect(fabric.route(0, 1, 0, [3])).toEqual([fabric.uplink(0, 3), fabric.downlink(3, 1)]);
    expect(fabric.route(1, 2, 0, [3, 0, 2])).toEqual([fabric.uplink(1, 3), fabric.coreUplink(0, 3, 0), fabric.coreDownlink(0, 1, 2), fabric.downlink(2, 2)]);
    // Every link is its own: hosts' NICs, racks' uplinks, then pods' core links, none shared.
    const all = [fabric.uplink(3, 3), fabric.downlink(3, 3), fabric.coreUplink(1, 3, 0), fabric.coreDownlink(0, 1, 3)];
    expect(new Set(all).size).toBe(4);
    expect(fabric.coreDownlink(0, 1, 3)).toBe(fabric.capacities.length - 1);
    expect(fabric.uplink(0, 0)).toBe(2 * 8 * 2);
  });

  it("refuses a half-given 3-tier shape and pods that do not divide the racks, naming the field", () => {
    expect(FabricSchema.safeParse({ ...clos3, aggUplinks: undefined }).error?.issues[0]?.path).toEqual(["aggUplinks"]);
    expect(FabricSchema.safeParse({ ...clos3, racksPerPod: 3 }).error?.issues[0]?.message).toMatch(/must divide racks/);
  });

  // Pod 0 = racks 0-1 (hosts 0-3), pod 1 = racks 2-3 (hosts 4-7). Three TP2 groups each
  // across the pods: racks at 4 and 2 (within λ = 4), pods at 6, over their 4 core links.
  const overPods = [
    [0, 4],
    [1, 6],
    [2, 5],
  ];
  // The same groups with the first brought home to pod 0: pods at 4.
  const withinPods = [
    [0, 3],
    [1, 6],
    [2, 5],
  ];

  it("ECMP hashes each hop on its tier's own hash", () => {
    const cluster = clusterOf(clos3, overPods, 2, true);
    const { dp, chosen } = route("ecmp", clos3, cluster);
    dp.forEach((f, i) => {
      const key = `${cluster.groups[f.group]!.job}/0/${f.ring}/${f.srcHost}>${f.dstHost}`;
      expect(chosen.dp[i]).toEqual([
        ecmpSpine(f.srcHost, f.dstHost, key, 1, 4, "tor"),
        ecmpSpine(f.srcHost, f.dstHost, key, 1, 1, "aggregation"),
        ecmpSpine(f.srcHost, f.dstHost, key, 1, 4, "core"),
      ]);
    });
  });

  it("Perfect routing isolates every DP flow when racks and pods are within their bounds", () => {
    const cluster = clusterOf(clos3, withinPods, 2, true);
    expect(Math.max(...podFragmentation(cluster))).toBe(4);
    const { dp, links, worst } = route("perfect", clos3, cluster);
    expect(worst).toBe(1);
    // Inter-pod flows climb to the core: four links each.
    dp.forEach((f, i) => expect(links[i]!.length).toBe(Math.floor(f.srcRack / 2) === Math.floor(f.dstRack / 2) ? 2 : 4));
  });

  it.each(["crux", "sglb"] as const)("%s, greedy hop by hop, gives each flow its own rack uplink but meets others at the core", (name) => {
    const { links, worst } = route(name, clos3, clusterOf(clos3, withinPods, 2, true));
    const firstHops = links.map((path) => path[0]!);
    expect(new Set(firstHops).size).toBe(firstHops.length);
    // The rack's choice of aggregation switch cannot see the switch's one core link, which
    // another rack's flow already took.
    expect(worst).toBe(2);
  });

  it("Perfect routing cannot isolate pods over their core links: 6 flows on 4 links share", () => {
    const { worst } = route("perfect", clos3, clusterOf(clos3, overPods, 2, true));
    expect(worst).toBe(2);
  });

  it("packet spraying sends every flow over its rack's one aggregate link", () => {
    const { links, fabric: sprayed } = route("spray", clos3, clusterOf(clos3, overPods, 2, true));
    expect(links[0]).toEqual([sprayed.uplink(0, 0), sprayed.downlink(0, 2)]);
    expect(sprayed.capacities[sprayed.uplink(0, 0)]).toBe(4e9);
  });

  it("MonkeyTree3's plan (the planner with the pod bound) meets both bounds", () => {
    const snapshot = { topology: { racks: 4, hostsPerRack: 2, gpusPerHost: 2, uplinksPerRack: 4, racksPerPod: 2 }, lambda: 4, podLambda: 4 };
    const cluster = clusterFromSnapshot({ ...snapshot, jobs: overPods.map((hosts, i) => ({ id: `j${i}`, rings: 2, hosts })) });
    const plan = planner.plan(cluster, { timeLimitMs: 10_000 });
    expect(plan.moves.length).toBeGreaterThan(0);
    const after = applyMoves(cluster, plan.moves);
    expect(Math.max(...rackFragmentation(cluster, after))).toBeLessThanOrEqual(4);
    expect(Math.max(...podFragmentation(cluster, after))).toBeLessThanOrEqual(4);
  });

  // Fillers hold every host; as pairs of them end, each TP2 job takes the two hosts they
  // free, one in each pod, building `overPods`; the last fillers then free hosts 3 and 7.
  const filler = (host: number, ends: number): SimJob =>
    SimJobSchema.parse({ id: `f${host}`, arrival: 0, hostsPerStage: 1, iterations: 1, computeSeconds: ends, ringBytes: 0 });
  const tp2 = (id: string, arrival: number): SimJob =>
    SimJobSchema.parse({ id, arrival, hostsPerStage: 2, rings: 2, iterations: 50, computeSeconds: 1, ringBytes: 1e9 });
  const trace = [...[1, 2, 3, 4, 1, 3, 2, 4].map((ends, host) => filler(host, ends)), tp2("g1", 1.5), tp2("g2", 2.5), tp2("g3", 3.5)].sort(
    (a, b) => a.arrival - b.arrival,
  );
  const config: SimConfigInput = { fabric: clos3, scheduler: "fifo", restartSeconds: 0 };
  const run = (system: SystemName) => simulateSystem(trace, config, system, planner);

  it("end to end: pod-unaware MonkeyTree leaves the pods over their core links, MonkeyTree3 moves a worker home", () => {
    const plain = run("monkeytree");
    const three = run("monkeytree3");
    expect(plain.plans).toEqual([]);
    expect(three.jobs.reduce((sum, j) => sum + j.moves, 0)).toBeGreaterThan(0);
    const worst = (r: typeof plain) => Math.max(...r.jobs.filter((j) => j.id.startsWith("g")).map((j) => j.slowdown));
    expect(worst(plain)).toBeGreaterThan(1.05);
    expect(worst(three)).toBeLessThan(worst(plain));
    expect(() => simulateSystem(trace, { ...config, fabric: { ...clos3, racksPerPod: undefined, aggUplinks: undefined } }, "monkeytree3", planner)).toThrow(
      /needs a 3-tier fabric/,
    );
  });
});

describe("rail-optimised", () => {
  const fabric = new Fabric(rail);

  it("sends NIC r's traffic between pods over rail r's uplinks only", () => {
    expect(fabric.hops(0, 1)).toEqual([{ tier: "tor", members: 1 }]);
    expect(fabric.route(0, 2, 1, [0])).toEqual([fabric.uplink(0, 1), fabric.downlink(1, 2)]);
    expect(fabric.route(0, 2, 0, [0])).toEqual([fabric.uplink(0, 0), fabric.downlink(0, 2)]);
    expect(FabricSchema.safeParse({ ...rail, uplinksPerRack: 3 }).error?.issues[0]?.path).toEqual(["uplinksPerRack"]);
  });

  // Pods: hosts 0-1, 2-3, 4-5. Two TP2 groups across pods 0-1 and 1-2: pod 1 carries two
  // groups, one ring of each per rail: 2 flows out on each rail, over its one uplink.
  const twoGroups = [
    [1, 2],
    [3, 4],
  ];

  it.each(["perfect", "crux", "sglb", "ecmp"] as const)("%s keeps each ring on its rail", (name) => {
    const cluster = clusterOf(rail, twoGroups);
    const { dp, links } = route(name, rail, cluster);
    dp.forEach((f, i) => expect(links[i]).toEqual([fabric.uplink(f.srcRack, f.ring), fabric.downlink(f.ring, f.dstRack)]));
  });

  it("Perfect routing isolates rings when each rail carries no more flows than it has uplinks", () => {
    expect(route("perfect", rail, clusterOf(rail, [[1, 2]])).worst).toBe(1);
    // Two groups through pod 1, one uplink per rail: they must share.
    expect(route("perfect", rail, clusterOf(rail, twoGroups)).worst).toBe(2);
  });

  it("spreads DP/FSDP jobs' single rings over the rails by the group's name", () => {
    const topology = clusterOf(rail, []).topology;
    const rails = new Set(
      Array.from({ length: 32 }, (_, i) => {
        const c = clusterFromSnapshot({ topology, jobs: [{ id: `dp${i}`, rings: 1, hosts: [1, 2] }] });
        return ringRail(c, dpFlows(c, c.placement)[0]!, 2);
      }),
    );
    expect(rails).toEqual(new Set([0, 1]));
  });
});

describe("presets on the new fabrics", () => {
  const small = (shape: FabricShape): FabricShape => ({ ...shape, racks: 4, hostsPerRack: 4 });
  it.each([
    ["paper-3tier", ["ecmp", "sglb", "perfect", "monkeytree", "monkeytree3", "spray"]],
    ["paper-rail", ["ecmp", "crux", "perfect", "monkeytree", "spray"]],
  ] as const)("%s, shrunk to 128 GPUs, runs every job to the end, spraying at the ideal pace", (name, systems) => {
    const preset = PRESETS[name];
    const fabric = { ...small(preset.fabric), ...(name === "paper-3tier" ? { racksPerPod: 2 } : {}) };
    const jobs = generateJobs({ seed: 3, hostCount: 16, mix: preset.mix, load: 1, jobs: 60 }, 50e9);
    for (const system of systems) {
      const result = simulateSystem(jobs, { fabric }, system, planner);
      expect(result.jobs.map((j) => j.id).sort()).toEqual(jobs.map((j) => j.id).sort());
      for (const j of result.jobs) expect(j.slowdown).toBeGreaterThanOrEqual(1 - 1e-9);
      if (system === "spray") for (const j of result.jobs) expect(j.slowdown).toBeCloseTo(1, 9);
      if (system.startsWith("monkeytree")) expect(result.plans.every((p) => p.status !== "infeasible")).toBe(true);
    }
  });

  it("gives the same result for the same seed on both fabrics", () => {
    const jobs = generateJobs({ seed: 4, hostCount: 16, mix: "tp8pp", load: 1, jobs: 40 }, 50e9);
    const fabrics = [{ ...small(PRESETS["paper-3tier"].fabric), racksPerPod: 2 }, small(PRESETS["paper-rail"].fabric)];
    const once = () =>
      fabrics.flatMap((fabric) => (["ecmp", "sglb", "monkeytree"] as const).map((system) => simulateSystem(jobs, { fabric, seed: 2 }, system, planner).jobs));
    expect(once()).toEqual(once());
  });
});
