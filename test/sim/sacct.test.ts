import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { InvalidInputError } from "../../sdk/contract/errors.ts";
import { bytesPerSecond } from "../../controller/simulator/fabric.ts";
import { sacctToTrace } from "../../controller/simulator/sacct.ts";
import { simulateSystem } from "../../controller/simulator/simulate.ts";

/**
 * What `sacct --json` prints on Slurm 22.05 (openapi dbv0.0.38's job dump), written from its
 * schema: Debian's sacct without slurmdbd only says "Slurm accounting storage is disabled".
 */
const fixture = JSON.parse(readFileSync(new URL("fixtures/sacct-22.05.json", import.meta.url), "utf8")) as { jobs: Record<string, unknown>[] };
const options = { gpusPerHost: 8, nicBytesPerSecond: bytesPerSecond(400), model: "gpt3-13b" };
const fabric = { racks: 2, hostsPerRack: 4, gpusPerHost: 8, uplinksPerRack: 4, nicGbps: 400 };

/** The fixture with job `index`'s fields replaced. */
const withJob = (index: number, patch: Record<string, unknown>) => ({ ...fixture, jobs: fixture.jobs.map((j, i) => (i === index ? { ...j, ...patch } : j)) });

describe("sacctToTrace", () => {
  it("maps submit time, nodes and elapsed time to arrival, DP degree and iterations of the named model", () => {
    const { jobs, skipped } = sacctToTrace(fixture, options);
    expect(jobs.map((j) => [j.id, j.arrival, j.model, j.hostsPerStage])).toEqual([
      ["slurm-101", 0, "gpt3-7b", 4],
      ["slurm-102", 600, "gpt3-13b", 2],
      ["slurm-103", 1200, "gpt-oss-20b", 8],
    ]);
    expect(skipped).toEqual([
      { job: "slurm-104", reason: "never ran" },
      { job: "slurm-105", reason: "no GPU" },
    ]);
    // Alone on the fabric, each job runs as long as it did on the cluster, to within an iteration.
    const run = simulateSystem(jobs, { fabric }, "spray", undefined);
    const elapsed: Record<string, number> = { "slurm-101": 7200, "slurm-102": 3600, "slurm-103": 5400 };
    for (const outcome of run.jobs) {
      const job = jobs.find((j) => j.id === outcome.id)!;
      expect(Math.abs(outcome.ideal - elapsed[outcome.id]!)).toBeLessThanOrEqual(outcome.ideal / job.iterations / 2 + 1e-6);
    }
  });

  it("reads Slurm 23.02's { set, number } counts and a plain-string comment as well", () => {
    const set = (number: number) => ({ set: true, infinite: false, number });
    const newer = withJob(0, { allocation_nodes: set(4), time: { submission: set(1700000000), elapsed: set(7200) }, comment: "monkeytree:model=gpt3-7b" });
    expect(sacctToTrace(newer, options).jobs[0]).toEqual(sacctToTrace(fixture, options).jobs[0]);
  });

  it("names the job and field of bad input, with the fix", () => {
    const noDefault = () => sacctToTrace(fixture, { gpusPerHost: options.gpusPerHost, nicBytesPerSecond: options.nicBytesPerSecond });
    expect(noDefault).toThrow(InvalidInputError);
    expect(noDefault).toThrow("sacct jobs[1] (job 102) at comment.job: names no model: submit with --comment monkeytree:model=NAME, or pass --model NAME");
    expect(() => sacctToTrace(withJob(0, { comment: { job: "monkeytree:model=gpt5" } }), options)).toThrow(
      /^sacct jobs\[0\] \(job 101\) at comment\.job: names model "gpt5"/,
    );
    expect(() => sacctToTrace(withJob(0, { tres: { allocated: [{ type: "gres", name: "gpu", count: 4 }] } }), options)).toThrow(
      /^sacct jobs\[0\] \(job 101\) at tres\.allocated gres\/gpu: 4 GPUs on 4 nodes; the simulator places whole hosts of 8 GPUs/,
    );
    expect(() => sacctToTrace(withJob(2, { time: { submission: "soon", elapsed: 5 } }), options)).toThrow(/^sacct jobs\[2\] \(job 103\) at time\.submission: /);
    expect(() => sacctToTrace(withJob(2, { job_id: 101 }), options)).toThrow(/^sacct jobs\[2\] \(job 101\) at job_id: job 101 appears twice/);
    expect(() => sacctToTrace({ jobs: "none" }, options)).toThrow(/^sacct at jobs: /);
    expect(() => sacctToTrace(fixture, { ...options, model: "nope" })).toThrow(/^sacct at --model: no model "nope"/);
  });
});
