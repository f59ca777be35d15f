import { describe, expect, it } from "vitest";
import { createPlanner } from "../../controller/planner/plan/index.ts";
import { simulateSystem } from "../../controller/simulator/simulate.ts";
import { InvalidInputError } from "../../sdk/contract/errors.ts";
import { generateJobs, idealRates, iterationSeconds, SimJobSchema } from "../../controller/simulator/jobs.ts";
import {
  meanGpuSeconds,
  PUBLISHED_MIXES,
  PUBLISHED_TYPES,
  publishedIterationSeconds,
  publishedJob,
  type JobType,
} from "../../controller/simulator/published.ts";

/** 400 Gbit/s, the artifact's link and NIC speed. */
const NIC = 50e9;
const typeNamed = (model: string): JobType => PUBLISHED_TYPES.find((t) => t.model === model)!;
const paperTrace = (seed: number, jobs: number, load = 0.5) => generateJobs({ seed, hostCount: 128, mix: "paper", load, jobs }, NIC);

describe("the published workload", () => {
  it("has the main mix's ten types, weights summing to 352, the tensor-parallel types the most frequent", () => {
    expect(PUBLISHED_TYPES).toHaveLength(10);
    expect(PUBLISHED_TYPES.reduce((sum, t) => sum + t.weight, 0)).toBe(352);
    expect(PUBLISHED_TYPES.filter((t) => t.weight === 100).map((t) => t.model)).toEqual(["llama2-70b-tp-dp", "llama3-70b-tp-dp"]);
  });

  it("offers load as the artifact reckons it: 31,350 GPU-seconds a job, 0.01633 jobs/s at 1,024 GPUs and 50% load", () => {
    // The artifact's generator, worked by hand from its job files at 400 Gbit/s.
    const gpuSeconds = meanGpuSeconds(PUBLISHED_TYPES, NIC);
    expect(gpuSeconds).toBeGreaterThan(31_350 * 0.995);
    expect(gpuSeconds).toBeLessThan(31_350 * 1.005);
    expect((0.5 * 1024) / gpuSeconds).toBeCloseTo(0.01633, 4);
  });

  it("turns per-GPU rings into hosts: one ring per job for DP and FSDP, one per GPU of a host for TP8", () => {
    expect(publishedJob(typeNamed("llama2-70b-fsdp"), 24, 8)).toMatchObject({
      rings: 1,
      stages: 1,
      hostsPerStage: 3,
      computeSeconds: 2.378,
      ringBytes: (2 * 23 * 137.43e9) / 24,
    });
    expect(publishedJob(typeNamed("llama3-70b-tp-dp"), 32, 8)).toMatchObject({ rings: 8, stages: 1, hostsPerStage: 4, ringBytes: (2 * 3 * 17.18e9) / 4 });
    const pp2 = publishedJob(typeNamed("llama2-70b-tp-dp-pp2"), 48, 8);
    // GPipe with 2 stages and 8 microbatches: 9 slots of a forward and a backward pass.
    expect(pp2).toMatchObject({ rings: 8, stages: 2, hostsPerStage: 3, ringBytes: (2 * 2 * 8.59e9) / 3, ppBytes: 2 * 8 * 8.39e6 });
    expect(pp2.computeSeconds).toBeCloseTo(9 * 0.171, 9);
    const moe = publishedJob(typeNamed("gpt-oss-20b-dp-moe"), 16, 8);
    // Each GPU sends to 15 others, 7 of them on its own host: those bytes never leave it.
    expect(moe.a2aBytes).toBeCloseTo((((8 * 8.836e9) / 16) * 8) / 15, 0);
    expect(moe.a2aHostBytes).toBeCloseTo((((8 * 8.836e9) / 16) * 7) / 15, 0);
  });

  it("costs an iteration alone as the artifact does, but for a pipeline's bubble, which the simulator charges", () => {
    for (const type of Object.values(PUBLISHED_MIXES).flat()) {
      for (const gpus of type.gpus) {
        const job = publishedJob(type, gpus, 8);
        const alone = iterationSeconds(job, idealRates(NIC, 8));
        const theirs = publishedIterationSeconds(type, gpus, NIC);
        if (type.pattern.kind === "pipeline") expect(alone).toBeGreaterThan(theirs);
        else expect(alone).toBeCloseTo(theirs, 9);
      }
    }
  });

  it("refuses GPU counts that are not whole hosts, stages and tensor-parallel groups", () => {
    expect(() => publishedJob(typeNamed("llama2-70b-fsdp"), 20, 8)).toThrow(/20 GPUs are not whole hosts of 8/);
    expect(() => publishedJob(typeNamed("llama2-70b-tp-dp-pp4"), 40, 8)).toThrow(/40 GPUs do not make 4 stages/);
    expect(() => publishedJob(typeNamed("llama2-70b-tp-dp"), 16, 4)).toThrow(/need hosts of 8 GPUs/);
  });
});

describe("the published figures' other mixes", () => {
  it("paper-dp draws the main mix's DP and FSDP jobs alone: one ring each, no all-to-all", () => {
    expect(PUBLISHED_MIXES["paper-dp"].map((t) => t.model)).toEqual(["llama2-70b-fsdp", "llama3-70b-fsdp", "gpt-7b-dp", "gpt-13b-dp"]);
    const jobs = generateJobs({ seed: 2, hostCount: 128, mix: "paper-dp", load: 0.8, jobs: 200 }, NIC);
    expect(new Set(jobs.map((j) => j.rings))).toEqual(new Set([1]));
    expect(jobs.every((j) => j.a2aBytes === 0 && [2, 3, 4].includes(j.hostsPerStage))).toBe(true);
  });

  it("paper-ep's jobs send at least ten times as much in their all-to-all as in their all-reduce (paper §7.10)", () => {
    const jobs = generateJobs({ seed: 2, hostCount: 128, mix: "paper-ep", load: 1, jobs: 100 }, NIC);
    expect(new Set(jobs.map((j) => j.model)).size).toBe(5);
    for (const job of jobs) {
      // A host's all-to-all against one ring hop of each of its 8 GPUs.
      const ratio = (job.a2aBytes + job.a2aHostBytes) / (8 * job.ringBytes);
      expect(ratio).toBeGreaterThan(10);
      expect(ratio).toBeLessThan(40);
    }
  });
});

describe("--mix paper traces", () => {
  it("are valid simulator jobs, the first arriving at 0, deterministic in the seed", () => {
    const jobs = paperTrace(3, 200);
    expect(jobs[0]!.arrival).toBe(0);
    for (const job of jobs) expect(SimJobSchema.parse(job)).toEqual(job);
    expect(paperTrace(3, 200)).toEqual(jobs);
    expect(paperTrace(4, 200)).not.toEqual(jobs);
  });

  it("draw types by weight and 100-1,000 iterations uniformly", () => {
    const jobs = paperTrace(1, 5000);
    const tp = jobs.filter((j) => j.model!.endsWith("-tp-dp")).length / jobs.length;
    expect(tp).toBeGreaterThan(200 / 352 - 0.03);
    expect(tp).toBeLessThan(200 / 352 + 0.03);
    const iterations = jobs.map((j) => j.iterations);
    expect(Math.min(...iterations)).toBeGreaterThanOrEqual(100);
    expect(Math.max(...iterations)).toBeLessThanOrEqual(1000);
    const mean = iterations.reduce((a, b) => a + b, 0) / jobs.length;
    expect(mean).toBeGreaterThan(530);
    expect(mean).toBeLessThan(570);
  });

  it("arrive at the rate that offers the load: twice the load, half the gaps", () => {
    const span = (load: number) => paperTrace(5, 2000, load).at(-1)!.arrival;
    // 128 hosts are 1,024 GPUs: 2,000 jobs at 50% load span about 2,000 / 0.01633 s.
    expect(span(0.5)).toBeGreaterThan((2000 / 0.01633) * 0.9);
    expect(span(0.5)).toBeLessThan((2000 / 0.01633) * 1.1);
    expect(span(1) / span(0.5)).toBeCloseTo(0.5, 5);
  });

  it("need hosts of 8 GPUs and a cluster that holds the largest job, and say so", () => {
    const refused = (options: { hostCount: number; gpusPerHost?: number }) => {
      try {
        generateJobs({ seed: 1, mix: "paper", load: 0.5, jobs: 10, ...options }, NIC);
      } catch (error) {
        expect(error).toBeInstanceOf(InvalidInputError);
        return (error as Error).message;
      }
      throw new Error("not refused");
    };
    expect(refused({ hostCount: 4 })).toMatch(/hostCount.*at least 8 hosts/);
    expect(refused({ hostCount: 64, gpusPerHost: 4 })).toMatch(/gpusPerHost.*hosts of 8 GPUs, not 4/);
  });

  it("run to the end on a small fabric: spraying at their ideal pace, MonkeyTree planning feasibly", async () => {
    const planner = await createPlanner();
    const jobs = generateJobs({ seed: 2, hostCount: 16, mix: "paper", load: 1, jobs: 40 }, NIC);
    const fabric = { racks: 4, hostsPerRack: 4, gpusPerHost: 8, uplinksPerRack: 4, nicGbps: 400 };
    for (const system of ["ecmp", "monkeytree", "spray"] as const) {
      const result = simulateSystem(jobs, { fabric }, system, planner);
      expect(result.jobs.map((j) => j.id).sort()).toEqual(jobs.map((j) => j.id).sort());
      for (const j of result.jobs) expect(j.slowdown).toBeGreaterThanOrEqual(1 - 1e-9);
      if (system === "spray") for (const j of result.jobs) expect(j.slowdown).toBeCloseTo(1, 9);
      if (system === "monkeytree") expect(result.plans.every((p) => p.status !== "infeasible")).toBe(true);
    }
  });
});
