import { beforeAll, describe, expect, it } from "vitest";
import { withinBounds } from "../../controller/planner/model/index.ts";
import { applyMoves, createPlanner, type Planner } from "../../controller/planner/plan/index.ts";
import { trace } from "../../controller/simulator/index.ts";

let planner: Planner;
beforeAll(async () => {
  planner = await createPlanner();
});

// Realistic events: the paper's best-fit scheduler at 90% load on a 512-GPU cluster. Every
// plan, applied step by step, must be valid and leave every rack (and pod) within bound, and
// never use more moves than the paper's program when that one is solved to optimality.
describe.each([
  ["dp", 2, undefined],
  ["tp8pp", 16, undefined],
  ["dp", 2, 2],
] as const)("planner on generated %s traces (λ = %i, pod λ = %s)", (mix, uplinks, podLambda) => {
  it("plans every violation validly and no worse than the paper's optimum", () => {
    const events = trace({
      seed: 11,
      topology: { racks: 8, hostsPerRack: 8, gpusPerHost: 8, uplinksPerRack: uplinks, ...(podLambda ? { racksPerPod: 2 } : {}) },
      ...(podLambda ? { podLambda } : {}),
      mix,
      events: 15,
    });
    let seen = 0;
    for (let step = events.next(undefined); !step.done;) {
      const cluster = step.value;
      const plan = planner.plan(cluster, { timeLimitMs: 20_000 });
      expect(["optimal", "feasible"]).toContain(plan.status);
      const after = applyMoves(cluster, plan.moves);
      expect(withinBounds(cluster, after)).toBe(true);
      expect(after).toEqual(plan.placement);
      const hosts = after.flat();
      expect(new Set(hosts).size).toBe(hosts.length);
      const paper = planner.plan(cluster, { formulation: "paper", timeLimitMs: 20_000 });
      if (paper.status === "optimal") expect(plan.moveCount).toBeLessThanOrEqual(paper.moveCount);
      seen++;
      step = events.next(plan.placement);
    }
    expect(seen).toBe(15);
  });
});
