import { describe, expect, it } from "vitest";
import { InvalidInputError } from "../../sdk/contract/errors.ts";
import { generateJobs, idealRates, iterationSeconds } from "../../controller/simulator/jobs.ts";
import { DEFAULT_TOKENS_PER_REPLICA } from "../../controller/simulator/models.ts";

const nic = 50e9;
const traceWith = (tokensPerReplica?: number) =>
  generateJobs({ seed: 4, hostCount: 128, mix: "tp8pp", load: 0.9, jobs: 200, ...(tokensPerReplica === undefined ? {} : { tokensPerReplica }) }, nic);

describe("generated traces' local batch", () => {
  it("scales every job's compute and pipeline bytes, not its rings, and keeps its ideal duration", () => {
    const full = traceWith();
    expect(traceWith(DEFAULT_TOKENS_PER_REPLICA)).toEqual(full);
    const half = traceWith(DEFAULT_TOKENS_PER_REPLICA / 2);
    expect(half.map((j) => [j.id, j.arrival, j.stages, j.hostsPerStage, j.ringBytes])).toEqual(
      full.map((j) => [j.id, j.arrival, j.stages, j.hostsPerStage, j.ringBytes]),
    );
    expect(full.some((j) => j.ppBytes > 0)).toBe(true);
    half.forEach((j, i) => {
      const f = full[i]!;
      expect(j.computeSeconds).toBeCloseTo(f.computeSeconds / 2, 12);
      expect(j.ppBytes).toBeCloseTo(f.ppBytes / 2, 6);
      // Shorter iterations, more of them: the same ideal time within one iteration, so the
      // offered load stays as asked.
      const ideal = (job: typeof j) => job.iterations * iterationSeconds(job, idealRates(nic, 8));
      expect(Math.abs(ideal(j) - ideal(f))).toBeLessThanOrEqual(iterationSeconds(f, idealRates(nic, 8)));
    });
  });

  it.each([0, 1.5, 4096 * 4096 + 1])("refuses %d tokens per replica, naming the field", (tokensPerReplica) => {
    expect(() => traceWith(tokensPerReplica)).toThrow(InvalidInputError);
    expect(() => traceWith(tokensPerReplica)).toThrow(/^trace options at tokensPerReplica: /);
  });
});
