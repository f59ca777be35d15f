import { describe, expect, it } from "vitest";
import { Random } from "../../controller/simulator/random.ts";
import { workload } from "../../controller/simulator/workload.ts";

const hostsOf = (job: { stages: number; hostsPerStage: number }) => job.stages * job.hostsPerStage;

describe("workload", () => {
  it("dp: single-group DP/FSDP jobs of power-of-two sizes up to a quarter of the cluster", () => {
    const mix = workload("dp", 512);
    const random = new Random(5);
    const sizes = new Set<number>();
    for (let n = 0; n < 3000; n++) {
      const job = mix.draw(random, n);
      expect(job).toMatchObject({ rings: 1, stages: 1 });
      expect(job.id).toMatch(new RegExp(`^(gpt3-7b|gpt3-13b|gpt-oss-20b|gpt-oss-120b)-${n}$`));
      sizes.add(job.hostsPerStage);
    }
    expect([...sizes].sort((a, b) => a - b)).toEqual([1, 2, 4, 8, 16, 32, 64, 128]);
  });

  it("tp8pp: TP=8 jobs with 2-4 equal stages of 1-8 hosts, next to DP/FSDP jobs", () => {
    const mix = workload("tp8pp", 1024);
    const random = new Random(6);
    let tp = 0;
    const n = 4000;
    for (let i = 0; i < n; i++) {
      const job = mix.draw(random, i);
      if (job.rings === 1) {
        expect(job.stages).toBe(1);
        continue;
      }
      tp++;
      expect(job.rings).toBe(8);
      expect(job.id).toMatch(/^llama[23]-70b-\d+$/);
      expect([2, 3, 4]).toContain(job.stages);
      expect([1, 2, 4, 8]).toContain(job.hostsPerStage);
    }
    expect(tp / n).toBeCloseTo(0.5, 1);
  });

  it("states the mean size its draws have", () => {
    for (const [name, hostCount] of [
      ["dp", 128],
      ["dp", 1024],
      ["tp8pp", 128],
    ] as const) {
      const mix = workload(name, hostCount);
      expect(mix.shapes.reduce((sum, [, p]) => sum + p, 0)).toBeCloseTo(1, 12);
      const random = new Random(9);
      const n = 50_000;
      let total = 0;
      let largest = 0;
      for (let i = 0; i < n; i++) {
        const hosts = hostsOf(mix.draw(random, i));
        total += hosts;
        largest = Math.max(largest, hosts);
      }
      expect(largest).toBeLessThanOrEqual(hostCount / 4);
      expect(Math.abs(total / n - mix.meanHosts) / mix.meanHosts).toBeLessThan(0.03);
    }
  });

  it("shrinks the sizes to fit a small cluster", () => {
    expect(workload("dp", 16).shapes.map(([shape]) => shape.hostsPerStage)).toEqual([1, 2, 4]);
    expect(() => workload("tp8pp", 4)).toThrow(RangeError);
  });
});
