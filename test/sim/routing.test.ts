import { describe, expect, it } from "vitest";
import { clusterFromSnapshot } from "../../controller/planner/model/cluster.ts";
import { defaultAddressOf, dpFlows, EPHEMERAL_PORTS, ROCE_V2_PORT } from "../../controller/planner/route/index.ts";
import { SimJobSchema, type SimJob } from "../../controller/simulator/jobs.ts";
import { Fabric } from "../../controller/simulator/fabric.ts";
import { choosePaths, ecmpSpine, RouteMemo, sourcePort } from "../../controller/simulator/routing.ts";
import { simulateSystem, type SimConfigInput } from "../../controller/simulator/simulate.ts";
import { referenceHop } from "../route/reference-hash.ts";

describe("ECMP in the simulator", () => {
  it("sends a flow where the switches' CRC-32 of its 5-tuple says, with its queue pair's port", () => {
    for (let n = 0; n < 2000; n++) {
      const key = `job${n}/0/0/${n}>${n + 9}`;
      const port = sourcePort(key, 5);
      expect(port).toBeGreaterThanOrEqual(EPHEMERAL_PORTS.first);
      expect(port).toBeLessThanOrEqual(EPHEMERAL_PORTS.last);
      const tuple = { srcAddress: defaultAddressOf(n % 128), dstAddress: defaultAddressOf((n + 9) % 128), protocol: 17, srcPort: port, dstPort: ROCE_V2_PORT };
      expect(ecmpSpine(n % 128, (n + 9) % 128, key, 5, 16)).toBe(referenceHop(tuple, 16, "tor"));
    }
  });

  it("spreads flows evenly over the spines, and collides some, as hashing does", () => {
    const counts = new Array<number>(16).fill(0);
    for (let n = 0; n < 16_000; n++) counts[ecmpSpine(n % 64, 64 + (n % 64), `f${n}`, 1, 16)]!++;
    for (const c of counts) expect(Math.abs(c - 1000)).toBeLessThan(150);
    // Sixteen flows out of one rack over sixteen uplinks: hashing alone almost never isolates them.
    let isolated = 0;
    for (let trial = 0; trial < 200; trial++) {
      const spines = new Set(Array.from({ length: 16 }, (_, f) => ecmpSpine(f, 100 + f, `t${trial}/${f}`, 1, 16)));
      if (spines.size === 16) isolated++;
    }
    expect(isolated).toBeLessThan(5);
  });

  it("keeps a flow's spine for the same key and seed, and draws others for another seed", () => {
    const keys = Array.from({ length: 64 }, (_, n) => `k${n}`);
    const spines = (seed: number) => keys.map((k) => ecmpSpine(1, 70, k, seed, 8));
    expect(spines(3)).toEqual(spines(3));
    expect(spines(4)).not.toEqual(spines(3));
  });

  it("keeps a job's flows on their spines while other jobs come and go: a port per queue pair, not per event", () => {
    const topology = { racks: 4, hostsPerRack: 2, gpusPerHost: 1, uplinksPerRack: 8 };
    const fabric = new Fabric({ ...topology, nicGbps: 400 }, false);
    const context = { fabric, seed: 1, sglbK: 2, intensity: () => 0, share: () => ({ dp: 1, pp: 0 }) };
    const a = { id: "a", rings: 1, groups: [[1, 2, 5]] };
    const spinesOfA = (jobs: { id: string; rings: number; groups: number[][] }[]) => {
      const cluster = clusterFromSnapshot({ topology, lambda: 8, jobs });
      const dp = dpFlows(cluster, cluster.placement);
      const { dp: paths } = choosePaths("ecmp", cluster, dp, [], [], context);
      return dp.flatMap((f, i) => (cluster.groups[f.group]!.job === "a" ? [`${f.srcHost}>${f.dstHost} on ${paths[i]!.join("/")}`] : []));
    };
    // Another job ahead of a in the controller's order shifts a's group numbers, not its ports.
    expect(spinesOfA([{ id: "0", rings: 1, groups: [[0, 3, 6]] }, a])).toEqual(spinesOfA([a]));
    expect(spinesOfA([a])).toHaveLength(3);
  });
});

describe("routings in the simulator", () => {
  // 3 racks of 2 one-GPU hosts, two uplinks each: left to right, a spans racks 0-1 and b racks
  // 1-2, so rack 1 carries two flows each way, one per uplink if the routing isolates them.
  const config: SimConfigInput = { fabric: { racks: 3, hostsPerRack: 2, gpusPerHost: 1, uplinksPerRack: 2, nicGbps: 8 }, scheduler: "fifo" };
  const job = (id: string, hosts: number): SimJob =>
    SimJobSchema.parse({ id, arrival: 0, hostsPerStage: hosts, iterations: 10, computeSeconds: 1, ringBytes: 1e9 });
  const jobs = [job("x", 1), job("a", 2), job("b", 2)];

  it.each(["perfect", "crux", "sglb"] as const)("%s gives each flow of rack 1 its own uplink", (system) => {
    const run = simulateSystem(jobs, { ...config, sglbK: 1 }, system, undefined);
    for (const j of run.jobs) expect(j.slowdown).toBeCloseTo(1, 9);
  });

  it("ECMP isolates them only when the hash happens to: the outcome follows the 5-tuples", () => {
    const collided = [1, 2, 3, 4, 5, 6, 7, 8].map((seed) => simulateSystem(jobs, { ...config, seed }, "ecmp", undefined).jobs.some((j) => j.slowdown > 1.25));
    expect(collided).toContain(true);
    expect(collided).toContain(false);
  });
});

describe("flows kept between routings", () => {
  it.each(["ecmp", "crux", "sglb"] as const)("%s routes the same with them as built anew, as groups come, move and go", (name) => {
    const topology = { racks: 4, hostsPerRack: 4, gpusPerHost: 2, uplinksPerRack: 4 };
    const fabric = new Fabric({ ...topology, nicGbps: 400 }, false);
    const memo = new RouteMemo();
    const route = (jobs: { id: string; rings: number; groups: number[][] }[], kept?: RouteMemo) => {
      const cluster = clusterFromSnapshot({ topology, lambda: 8, jobs });
      const dp = dpFlows(cluster, cluster.placement);
      const context = { fabric, seed: 2, sglbK: 2, intensity: (job: string) => job.length, share: () => ({ dp: 1, pp: 1 }), ...(kept ? { memo: kept } : {}) };
      return choosePaths(name, cluster, dp, [], [], context).dp;
    };
    const a = { id: "a", rings: 2, groups: [[0, 5, 10]] };
    const b = { id: "b", rings: 1, groups: [[1, 6]] };
    const steps = [
      [a, b],
      [a, { ...b, groups: [[1, 14]] }],
      [{ id: "0", rings: 1, groups: [[2, 7]] }, a],
      [a, b],
    ];
    for (const jobs of steps) expect(route(jobs, memo)).toEqual(route(jobs));
  });
});

describe("SGLB's re-placement", () => {
  it("re-places flows until each one's spine is among the K that offer it the most", () => {
    // 6 racks of 4 one-GPU hosts, 4 spines, K = 2; 8 jobs of 3 hosts strided across racks,
    // so rings meet on uplinks and downlinks in a tangle a single greedy pass leaves uneven.
    const topology = { racks: 6, hostsPerRack: 4, gpusPerHost: 1, uplinksPerRack: 4 };
    const fabric = new Fabric({ ...topology, nicGbps: 400 }, false);
    const jobs = Array.from({ length: 8 }, (_, j) => ({ id: `j${j}`, rings: 1, groups: [[0, 1, 2].map((k) => ((3 * j + k) * 5) % 24)] }));
    expect(new Set(jobs.flatMap((j) => j.groups[0]!)).size).toBe(24);
    const cluster = clusterFromSnapshot({ topology, lambda: 8, jobs });
    const dp = dpFlows(cluster, cluster.placement).filter((f) => f.srcRack !== f.dstRack);
    const { dp: choices } = choosePaths("sglb", cluster, dp, [], [], { fabric, seed: 3, sglbK: 2, intensity: () => 0, share: () => ({ dp: 1, pp: 1 }) });
    const links = (i: number, spine: number) => fabric.route(dp[i]!.srcRack, dp[i]!.dstRack, 0, [spine]);
    const load = new Map<number, number>();
    dp.forEach((_, i) => links(i, choices[i]![0]!).forEach((l) => load.set(l, (load.get(l) ?? 0) + 1)));
    dp.forEach((_, i) => {
      // Every flow fills a link, so a spine offers the less the more flows its busier link has.
      const others = (spine: number) => Math.max(...links(i, spine).map((l) => (load.get(l) ?? 0) - (spine === choices[i]![0] ? 1 : 0)));
      const best = [0, 1, 2, 3].sort((a, b) => others(a) - others(b) || a - b).slice(0, 2);
      expect(best, `flow ${i}`).toContain(choices[i]![0]);
    });
  });
});

describe("load-aware routings with all-to-all flows", () => {
  // 3 racks of 3 one-GPU hosts, two uplinks each, FIFO from the left: x on hosts 0-1, d's ring
  // on hosts 2-3 (racks 0, 1), e's all-to-all on hosts 4-6 (racks 1, 2). Rack 1 sends d's ring
  // and e's sub-flows 4→6 and 5→6, each of which wants half a link (a NIC sends to two peers).
  const config: SimConfigInput = { fabric: { racks: 3, hostsPerRack: 3, gpusPerHost: 1, uplinksPerRack: 2, nicGbps: 8 }, scheduler: "fifo", sglbK: 1 };
  const job = (id: string, hosts: number, extra: Partial<SimJob> = {}): SimJob =>
    SimJobSchema.parse({ id, arrival: 0, hostsPerStage: hosts, iterations: 10, computeSeconds: 1, ringBytes: 1e9, ...extra });
  const jobs = [job("x", 2), job("d", 2), job("e", 3, { ringBytes: 0, a2aBytes: 2e9 })];

  it.each(["crux", "sglb"] as const)("%s weighs a flow by the share of a link it can fill, so the ring keeps an uplink of its own", (system) => {
    // Counting flows (e's rings too, which carry nothing), the second sub-flow ties with the
    // ring's uplink and joins it, and the ring runs at half speed; weighed, both half-link
    // sub-flows fill the other uplink.
    const run = simulateSystem(jobs, config, system, undefined);
    for (const j of run.jobs) expect(j.slowdown).toBeCloseTo(1, 9);
  });
});

describe("Perfect routing's other flows", () => {
  // Two racks of one host with two NICs and two uplinks: the all-to-all sends one sub-flow per
  // NIC each way, which round-robin puts on different uplinks whatever their 5-tuples hash to.
  const fabric = { racks: 2, hostsPerRack: 1, gpusPerHost: 2, uplinksPerRack: 2, nicGbps: 8 };
  const ep = [SimJobSchema.parse({ id: "e", arrival: 0, hostsPerStage: 2, iterations: 10, computeSeconds: 1, ringBytes: 0, a2aBytes: 2e9 })];
  const seeds = [1, 2, 3, 4, 5, 6, 7, 8];

  it("spreads an all-to-all round-robin over the uplinks, as its pipeline flows, where ECMP collides on some seeds", () => {
    const slowdowns = (system: "perfect" | "ecmp") => seeds.map((seed) => simulateSystem(ep, { fabric, seed }, system, undefined).jobs[0]!.slowdown);
    for (const s of slowdowns("perfect")) expect(s).toBeCloseTo(1, 9);
    expect(slowdowns("ecmp").some((s) => s > 1.25)).toBe(true);
  });

  it("takes turns per rail on a rail-optimised fabric, whose rails have uplinks of their own", () => {
    // Two pods of two hosts with two NICs, two uplinks per rail: on each rail a pod sends four
    // cross-pod sub-flows of a third of a link, two per uplink when each rail takes its own
    // turns; turns taken per pod across rails would put all four on one uplink.
    const rail = { racks: 2, hostsPerRack: 2, gpusPerHost: 2, uplinksPerRack: 4, uplinksPerRail: 2, nicGbps: 8 };
    const job = SimJobSchema.parse({ id: "e", arrival: 0, hostsPerStage: 4, iterations: 10, computeSeconds: 1, ringBytes: 0, a2aBytes: 2e9 });
    for (const seed of seeds) expect(simulateSystem([job], { fabric: rail, seed }, "perfect", undefined).jobs[0]!.slowdown).toBeCloseTo(1, 9);
  });
});
