import { beforeAll, describe, expect, it } from "vitest";
import { createPlanner, type Planner } from "../../controller/planner/plan/index.ts";
import { generateJobs, idealRates, iterationSeconds, parseSimJobs, SimJobSchema, type SimJob } from "../../controller/simulator/jobs.ts";
import { simulationReport } from "../../controller/simulator/report.ts";
import { simulateSystem, SYSTEMS_2TIER, type SimConfigInput, type SystemRun } from "../../controller/simulator/simulate.ts";

let planner: Planner;
beforeAll(async () => {
  planner = await createPlanner();
});

/** 3 racks of 2 one-GPU hosts, one uplink each, links at 1 GB/s. */
const tiny: SimConfigInput = { fabric: { racks: 3, hostsPerRack: 2, gpusPerHost: 1, uplinksPerRack: 1, nicGbps: 8 }, scheduler: "fifo", lambda: 1 };

const job = (id: string, hosts: number, extra: Partial<SimJob> = {}): SimJob =>
  SimJobSchema.parse({ id, arrival: 0, hostsPerStage: hosts, iterations: 10, computeSeconds: 1, ringBytes: 1e9, ...extra });

// Left to right: x on host 0, a on hosts 1-2 (racks 0, 1), b on hosts 3-4 (racks 1, 2); host 5
// is free. a's and b's rings both cross rack 1's one uplink and downlink.
const collide = (checkpointBytes = 0) => [job("x", 1), job("a", 2, { checkpointBytes }), job("b", 2, { checkpointBytes })];

const finish = (run: SystemRun, id: string) => run.jobs.find((j) => j.id === id)!;

describe("simulateSystem", () => {
  it("halves the rate of two rings that share an uplink", () => {
    const run = simulateSystem(collide(), tiny, "ecmp", undefined);
    // Each iteration: 1 s compute + 1 GB at half of 1 GB/s.
    expect(finish(run, "a").finish).toBeCloseTo(30, 9);
    expect(finish(run, "b").finish).toBeCloseTo(30, 9);
    expect(finish(run, "a").slowdown).toBeCloseTo(1.5, 9);
    expect(finish(run, "x").slowdown).toBeCloseTo(1, 9);
    expect(run.fragmentation.peakMaxRack).toBe(2);
    // Racks 0, 1, 2 carry 1, 2 and 1 rings for the whole run: 4 in all, 2 groups fragmented.
    expect(run.fragmentation.peakTotal).toBe(4);
    expect(run.fragmentation.meanTotal).toBeCloseTo(4, 9);
    expect(run.fragmentation.meanRack).toBeCloseTo(4 / 3, 9);
    expect(run.fragmentation.meanFragmentedGroups).toBeCloseTo(2, 9);
  });

  it("runs every job at its ideal pace with packet spraying on a full-bisection fabric", () => {
    const run = simulateSystem(collide(), tiny, "spray", undefined);
    for (const j of run.jobs) expect(j.slowdown).toBeCloseTo(1, 9);
  });

  it("plans like the controller when a rack goes over λ, pays the restart, and isolates the rings", () => {
    const run = simulateSystem(collide(), tiny, "monkeytree", planner);
    expect(run.plans.map((p) => p.moves)).toEqual([1]);
    // b's worker on rack 1 moves to the free host 5: b resumes after the 10 s restart, alone.
    expect(finish(run, "b").moves).toBe(1);
    expect(finish(run, "b").finish).toBeCloseTo(10 + 20, 9);
    expect(finish(run, "a").finish).toBeCloseTo(20, 9);
    expect(run.migrationSeconds).toEqual([10]);
    expect(run.bytesMoved).toBe(0);
  });

  it("moves checkpoints as flows that compete with the rings they cross", () => {
    const run = simulateSystem(collide(2e9), tiny, "monkeytree", planner);
    // The checkpoint (host 3 → 5) shares rack 1's uplink with a's ring: 0.5 GB/s each for 4 s.
    // a does 4/3 iterations meanwhile, then 2 s each; b resumes at 4 + 10 s.
    expect(run.bytesMoved).toBe(2e9);
    expect(run.migrationSeconds[0]).toBeCloseTo(14, 9);
    expect(finish(run, "a").finish).toBeCloseTo(4 + (10 - 4 / 3) * 2, 9);
    expect(finish(run, "b").finish).toBeCloseTo(14 + 20, 9);
  });

  it("runs an expert-parallel all-to-all as one flow over every pair of hosts and every NIC", () => {
    // Two racks of one host with two NICs: the all-to-all crosses the racks on 2 NICs each way.
    const fabric = { racks: 2, hostsPerRack: 1, gpusPerHost: 2, nicGbps: 8 };
    const ep = [job("e", 2, { ringBytes: 0, a2aBytes: 2e9 })];
    // Ideal: a host sends 2 GB over its two 1 GB/s NICs, 1 s, after 1 s of compute.
    const spray = simulateSystem(ep, { fabric: { ...fabric, uplinksPerRack: 1 } }, "spray", undefined);
    expect(finish(spray, "e").finish).toBeCloseTo(20, 9);
    // One uplink carries both NICs' sub-flows: half rate, 2 s per all-to-all.
    const oneUplink = simulateSystem(ep, { fabric: { ...fabric, uplinksPerRack: 1 } }, "ecmp", undefined);
    expect(finish(oneUplink, "e").slowdown).toBeCloseTo(1.5, 9);
    // Two uplinks: load balancing puts the sub-flows on different spines.
    const balanced = simulateSystem(ep, { fabric: { ...fabric, uplinksPerRack: 2 }, sglbK: 1 }, "sglb", undefined);
    expect(finish(balanced, "e").slowdown).toBeCloseTo(1, 9);
  });

  it("sends the all-to-all's bytes between a host's own GPUs at NIC speed, off the uplinks", () => {
    const fabric = { racks: 2, hostsPerRack: 1, gpusPerHost: 2, nicGbps: 8, uplinksPerRack: 1 };
    // Half the bytes cross the one uplink (two sub-flows each way, 2 s); the other half stays
    // on each host (1 GB over two 1 GB/s NICs, 0.5 s), which no congestion slows.
    const run = simulateSystem([job("e", 2, { ringBytes: 0, a2aBytes: 2e9, a2aHostBytes: 1e9 })], { fabric }, "ecmp", undefined);
    expect(finish(run, "e").finish).toBeCloseTo(10 * (1 + 2 + 0.5), 9);
    expect(finish(run, "e").slowdown).toBeCloseTo(3.5 / 2.5, 9);
  });

  it("lets a job's own all-reduce and all-to-all take turns on the uplinks they share", () => {
    const fabric = { racks: 2, hostsPerRack: 1, gpusPerHost: 2, nicGbps: 8, uplinksPerRack: 1 };
    const run = simulateSystem([job("e", 2, { ringBytes: 1e9, a2aBytes: 2e9 })], { fabric }, "ecmp", undefined);
    // 1 s compute; the ring alone on the uplink, 1 s; then the all-to-all's two sub-flows
    // each way share it, 1 GB/s per host, 2 s. Together they would take 7 s.
    expect(finish(run, "e").finish).toBeCloseTo(10 * (1 + 1 + 2), 9);
  });

  it("runs warm-up jobs like any other but leaves them out of the results", () => {
    // The warm-up job holds every host, so the measured one waits for it, then runs alone.
    const run = simulateSystem([job("w", 6, { warmup: true }), job("m", 2, { arrival: 1 })], tiny, "ecmp", undefined);
    expect(run.jobs.map((j) => j.id)).toEqual(["m"]);
    expect(finish(run, "m").start).toBeCloseTo(20, 9);
    expect(finish(run, "m").slowdown).toBeCloseTo(1, 9);
  });

  it("holds the queue while a migration's state moves, with queueInMoves hold, and starts it for the restart", () => {
    // 4 racks: hosts 6 and 7 stay free while b's worker moves, and a job arrives meanwhile.
    const roomy: SimConfigInput = { ...tiny, fabric: { ...tiny.fabric, racks: 4 } };
    const jobs = [...collide(8e9), job("late", 1, { arrival: 1 })];
    const placed = simulateSystem(jobs, roomy, "monkeytree", planner);
    const held = simulateSystem(jobs, { ...roomy, queueInMoves: "hold" }, "monkeytree", planner);
    expect(finish(placed, "late").start).toBeCloseTo(1, 9);
    // The move started at 0; its restart began 10 s before it ended.
    expect(held.migrationSeconds).toHaveLength(1);
    expect(held.migrationSeconds[0]!).toBeGreaterThan(11);
    expect(finish(held, "late").start).toBeCloseTo(held.migrationSeconds[0]! - 10, 9);
    expect(simulationReport({ ...roomy, queueInMoves: "hold" }, [{ run: held, load: null }]).config.queueInMoves).toBe("hold");
  });

  it("charges a plan's solve time in simulated time with planTime solve, at most the time limit, and drops a plan whose cluster changed meanwhile", () => {
    // Every plan takes 12 s of the machine's time. x ends at 10 s, while the first is computed.
    const slow: Planner = { plan: (cluster, options) => ({ ...planner.plan(cluster, options), solveMs: 12_000 }) };
    const dropped = simulateSystem(collide(), { ...tiny, planTime: "solve" }, "monkeytree", slow);
    expect(dropped.plans.map((p) => [p.time, p.status, p.moves])).toEqual([
      [0, "stale", 0],
      [12, "optimal", 1],
    ]);
    expect(simulationReport(tiny, [{ run: dropped, load: null }]).systems[0]?.solver).toMatchObject({ plans: 2, stale: 1 });
    // Planned again when the first arrived, carried out at 24 s, where a and b (3 s an
    // iteration side by side) end their 8th iteration; the one moved resumes after the 10 s
    // restart, and each runs alone.
    const [moved, stayed] = ["a", "b"].map((id) => finish(dropped, id)).sort((x, y) => y.moves - x.moves);
    expect([moved!.moves, moved!.finish, stayed!.finish]).toEqual([1, expect.closeTo(24 + 10 + 2 * 2, 9), expect.closeTo(24 + 2 * 2, 9)]);
    // Within 5 s the plan arrives before x ends: b stops after its 2nd iteration, at 6 s.
    const limited = simulateSystem(collide(), { ...tiny, planTime: "solve", planTimeLimitMs: 5_000 }, "monkeytree", slow);
    expect(limited.plans.map((p) => [p.time, p.status, p.moves])).toEqual([[0, "optimal", 1]]);
    expect(finish(limited, "b").finish).toBeCloseTo(6 + 10 + 8 * 2, 9);
    expect(limited.migrationSeconds).toEqual([11]);
    // Free, as the paper's simulator charges it: planned and stopped at 0 s.
    expect(finish(simulateSystem(collide(), tiny, "monkeytree", slow), "b").finish).toBeCloseTo(10 + 20, 9);
  });

  it("moves each job of a plan on its own with migrateBy job, where plan moves them together", () => {
    // collide()'s jobs on racks 0-2 and, 2 s slower an iteration, again on racks 3-5; hosts 5
    // and 11 hold jobs of 1 s. The plan at 0 s moves x's, y's and c's workers, which have no
    // state, and one of a's, whose 8 GB take 16 s.
    const fabric = { ...tiny.fabric, racks: 6 };
    const hole = (id: string) => job(id, 1, { iterations: 1, ringBytes: 0 });
    const slow = { computeSeconds: 2 };
    const jobs = [...collide(8e9), hole("h5"), job("y", 1), job("c", 2, slow), job("d", 2, slow), hole("h11")];
    const together = simulateSystem(jobs, { ...tiny, fabric }, "monkeytree", planner);
    const apart = simulateSystem(jobs, { ...tiny, fabric, migrateBy: "job" }, "monkeytree", planner);
    for (const run of [together, apart]) expect(run.plans.map((p) => [p.time, p.moves])).toEqual([[0, 4]]);
    const ends = (run: SystemRun) => Object.fromEntries(run.jobs.filter((j) => j.moves > 0).map((j) => [j.id, j.finish]));
    // Together, every moved job waits for the 8 GB, then restarts; apart, each restarts once its
    // own state (none for three of them) arrived, 16 s sooner.
    expect(together.migrationSeconds).toEqual([26]);
    expect([...apart.migrationSeconds].sort((x, y) => x - y)).toEqual([10, 10, 10, 26]);
    expect(ends(together)).toEqual({ x: 36, y: 36, a: 46, c: 56 });
    expect(ends(apart)).toEqual({ x: 20, y: 20, a: 46, c: 40 });
  });

  it("queues jobs first in, first out until the front-end can place them", () => {
    const jobs = [job("big", 6), job("next", 1, { arrival: 1 })];
    const run = simulateSystem(jobs, tiny, "ecmp", undefined);
    expect(finish(run, "next").start).toBeCloseTo(finish(run, "big").finish, 9);
  });

  it("backfills: a later job that fits starts while the queue's head waits, which fifo does not allow", () => {
    const jobs = [job("first", 4), job("big", 6, { arrival: 1 }), job("small", 1, { arrival: 2 })];
    const fifo = simulateSystem(jobs, tiny, "ecmp", undefined);
    const backfill = simulateSystem(jobs, { ...tiny, queue: "backfill" }, "ecmp", undefined);
    expect(finish(fifo, "small").start).toBeCloseTo(finish(fifo, "big").finish, 9);
    expect(finish(backfill, "small").start).toBeCloseTo(2, 9);
    // Nothing is reserved for the head: it starts once both jobs ahead of it in the cluster end.
    expect(finish(backfill, "big").start).toBeCloseTo(Math.max(finish(backfill, "first").finish, finish(backfill, "small").finish), 9);
    expect(simulationReport(tiny, [{ run: fifo, load: null }]).config.queue).toBe("fifo");
  });

  it("refuses an unknown queue discipline, naming the field", () => {
    expect(() => simulateSystem([job("a", 1)], { ...tiny, queue: "lifo" as "fifo" }, "ecmp", undefined)).toThrow(
      /simulation config at queue: Invalid option: expected one of "fifo"\|"backfill"/,
    );
  });

  it("refuses a job larger than the cluster, naming it", () => {
    expect(() => simulateSystem([job("huge", 7)], tiny, "ecmp", undefined)).toThrow(/job huge needs 7 hosts; the cluster has 6/);
  });

  it("holds its invariants on a generated trace: every job ends, none beats its ideal, spraying is ideal, moves are paid for", () => {
    const config: SimConfigInput = { fabric: { racks: 8, hostsPerRack: 8, gpusPerHost: 8, uplinksPerRack: 2 }, lambda: 2 };
    const jobs = generateJobs({ seed: 5, hostCount: 64, mix: "tp8pp", load: 1, jobs: 150 }, 50e9);
    const byId = new Map(jobs.map((j) => [j.id, j]));
    let totalMoved = 0;
    for (const system of SYSTEMS_2TIER) {
      const run = simulateSystem(jobs, config, system, planner);
      expect(run.jobs.map((j) => j.id).sort()).toEqual(jobs.map((j) => j.id).sort());
      for (const j of run.jobs) {
        expect(j.slowdown).toBeGreaterThanOrEqual(1 - 1e-9);
        expect(j.start).toBeGreaterThanOrEqual(j.arrival);
        if (system === "spray") expect(j.slowdown).toBeCloseTo(1, 9);
      }
      const moved = run.jobs.reduce((sum, j) => sum + j.moves * byId.get(j.id)!.checkpointBytes, 0);
      expect(Math.abs(run.bytesMoved - moved)).toBeLessThanOrEqual(1e-9 * moved);
      totalMoved += moved;
      expect(run.migrationSeconds.every((s) => s >= 10)).toBe(true);
      if (system.startsWith("monkeytree")) expect(run.plans.every((p) => p.status !== "infeasible")).toBe(true);
    }
    expect(totalMoved).toBeGreaterThan(0);
  });

  it("gives the same result for the same seed, and another trace for another seed", () => {
    const config: SimConfigInput = { fabric: { racks: 8, hostsPerRack: 8, gpusPerHost: 8, uplinksPerRack: 4 }, lambda: 2 };
    const jobsOf = (seed: number) => generateJobs({ seed, hostCount: 64, mix: "dp", load: 0.9, jobs: 120 }, 50e9);
    const once = (seed: number) => {
      const jobs = jobsOf(seed);
      const report = simulationReport(
        config,
        SYSTEMS_2TIER.map((system) => ({ run: simulateSystem(jobs, config, system, planner), load: 0.9 })),
      );
      // Solve times are wall-clock; everything else must repeat exactly.
      return JSON.parse(JSON.stringify(report, (key, value: unknown) => (key === "solver" ? undefined : value))) as unknown;
    };
    const first = once(3);
    expect(once(3)).toEqual(first);
    expect(once(4)).not.toEqual(first);
    const monkeytree = (first as ReturnType<typeof simulationReport>).systems.find((s) => s.name === "monkeytree")!;
    expect(monkeytree.events.count).toBeGreaterThan(0);
  });
});

describe("traces", () => {
  it("offers the target load with the paper's models", () => {
    const hostCount = 128;
    const jobs = generateJobs({ seed: 9, hostCount, mix: "tp8pp", load: 0.7, jobs: 3000 }, 50e9);
    const work = jobs.reduce((sum, j) => sum + j.stages * j.hostsPerStage * j.iterations * iterationSeconds(j, idealRates(50e9, 8)), 0);
    const span = jobs[jobs.length - 1]!.arrival;
    expect(work / (hostCount * span)).toBeGreaterThan(0.6);
    expect(work / (hostCount * span)).toBeLessThan(0.8);
    expect(new Set(jobs.map((j) => j.model))).toEqual(new Set(["gpt3-7b", "gpt3-13b", "gpt-oss-20b", "gpt-oss-120b", "llama2-70b", "llama3-70b"]));
    for (const j of jobs) expect(SimJobSchema.parse(j)).toEqual(j);
  });

  it("gives EP-dominated jobs all-to-all bytes as a multiple of their ring bytes", () => {
    const jobs = generateJobs({ seed: 2, hostCount: 128, mix: "tp8pp", load: 0.9, jobs: 200, epFactor: 10 }, 50e9);
    for (const j of jobs) expect(j.a2aBytes).toBeCloseTo(10 * j.ringBytes * j.rings, 0);
    expect(jobs.some((j) => j.a2aBytes > 0)).toBe(true);
  });

  it("draws warm-up jobs before the measured ones, from the same mix, marked as such", () => {
    const jobs = generateJobs({ seed: 2, hostCount: 128, mix: "tp8pp", load: 0.9, jobs: 30, warmupJobs: 20, epFactor: 10 }, 50e9);
    expect(jobs.map((j) => j.warmup)).toEqual([...new Array<boolean>(20).fill(true), ...new Array<boolean>(30).fill(false)]);
    for (const j of jobs) expect(j.a2aBytes).toBeCloseTo(10 * j.ringBytes * j.rings, 0);
  });

  it("reads trace lines, naming the line and field of a bad one, and sorts by arrival", () => {
    const good = { id: "a", arrival: 5, hostsPerStage: 2, iterations: 3, computeSeconds: 1, ringBytes: 10 };
    expect(parseSimJobs([good, { ...good, id: "b", arrival: 1 }]).map((j) => j.id)).toEqual(["b", "a"]);
    expect(() => parseSimJobs([good, { ...good, id: "b", iterations: 0 }], "trace t.jsonl")).toThrow(/^trace t.jsonl line 2 at iterations: /);
    expect(() => parseSimJobs([good, good])).toThrow(/line 2 at id: job id "a" is used twice/);
  });
});
