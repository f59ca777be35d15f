import { readFileSync } from "node:fs";
import { beforeAll, describe, expect, it } from "vitest";
import { parseSnapshotText, type Cluster } from "../../controller/planner/model/index.ts";
import { countsOf, CountState, moveDistance } from "../../controller/planner/plan/counts.ts";
import { createPlanner, type PlanProgress, type Planner } from "../../controller/planner/plan/index.ts";
import { repair } from "../../controller/planner/plan/repair.ts";
import { Search } from "../../controller/planner/plan/search.ts";
import { constrain, trace, type SchedulerName } from "../../controller/simulator/index.ts";
import { planDefect } from "./oracle.ts";

let planner: Planner;
beforeAll(async () => {
  planner = await createPlanner();
});

/** Nodes a quick exact search gets to tell the easy events from the hard. */
const QUICK_NODES = 20_000;

/**
 * The hardest events we generate: 2,048 GPUs at λ = 2, about a third of the jobs pinned and a
 * quarter of the free hosts unavailable, kept where a quick exact search finds no plan but a
 * valid placement exists (HiGHS alone, given the time, finds one; racks that pinned jobs keep
 * over may stay over). Behind best-fit the cluster is full (0–4 free hosts); behind the random
 * front-end jobs lie scattered and plans take 10 moves and more. The trace goes on from each
 * event's planned placement.
 */
function hardEvents(count: number, scheduler: SchedulerName): { cluster: Cluster; optimum: number }[] {
  const events = trace({
    seed: 1,
    topology: { racks: 32, hostsPerRack: 8, gpusPerHost: 8, uplinksPerRack: 2 },
    lambda: 2,
    mix: "dp",
    events: count,
    scheduler,
  });
  const hard: { cluster: Cluster; optimum: number }[] = [];
  for (let i = 0, step = events.next(undefined); !step.done; i++) {
    const cluster = step.value;
    const pinned = constrain(cluster, { pinned: 1 / 3, unavailable: 0.25, seed: 1000 + i });
    if (new Search(new CountState(pinned), { nodeLimit: QUICK_NODES }).run(12, Number.POSITIVE_INFINITY).kind !== "found") {
      const settled = planner.plan(pinned, { timeLimitMs: 120_000, budget: { exactNodes: 0, repairSteps: 0 } });
      const noRoom = settled.bestEffort?.racks.some((r) => r.cause === "no-room") ?? false;
      if (settled.status === "optimal" && !noRoom) hard.push({ cluster: pinned, optimum: settled.moveCount });
    }
    step = events.next(planner.plan(cluster, { timeLimitMs: 120_000, budget: { exactNodes: QUICK_NODES, diveNodes: 0, mipNodes: 0 } }).placement);
  }
  return hard;
}

describe("repair", () => {
  it("finds a valid plan for the shipped hard event in a few steps, without the search", () => {
    const cluster = parseSnapshotText(readFileSync(new URL("../../cli/snapshots/hard-2048gpu-lambda2.json", import.meta.url), "utf8"), "hard");
    const state = new CountState(cluster);
    const repaired = repair(state);
    expect(repaired).toBeDefined();
    expect(state.valid).toBe(true);
    // The optimum is 8 moves; a quick repair may take more, never an unbounded number.
    const moves = moveDistance(countsOf(cluster), repaired!);
    expect(moves).toBeGreaterThanOrEqual(8);
    expect(moves).toBeLessThanOrEqual(30);
  });

  it("gives up after its steps, leaving no plan, rather than searching on", () => {
    const cluster = parseSnapshotText(readFileSync(new URL("../../cli/snapshots/hard-2048gpu-lambda2.json", import.meta.url), "utf8"), "hard");
    expect(repair(new CountState(cluster), 1)).toBeUndefined();
  });
});

describe.each([
  { scheduler: "best-fit" as const, count: 30 },
  { scheduler: "random" as const, count: 25 },
])("the planner's first plan on the hardest events behind $scheduler", ({ scheduler, count }) => {
  let events: { cluster: Cluster; optimum: number }[] = [];
  beforeAll(() => {
    events = hardEvents(count, scheduler);
  }, 240_000);

  it("the events are hard: pinned jobs, no quick exact plan", () => {
    expect(events.length).toBeGreaterThanOrEqual(3);
    for (const { cluster } of events) {
      expect(cluster.groups.some((g) => !g.movable)).toBe(true);
    }
    // Full racks behind best-fit; long plans behind the random front-end.
    if (scheduler === "best-fit")
      for (const { cluster } of events) expect(cluster.unavailable.length + cluster.placement.flat().length).toBeGreaterThanOrEqual(cluster.hostCount - 4);
    else expect(events.filter((e) => e.optimum >= 10).length).toBeGreaterThanOrEqual(3);
  });

  it("has a valid plan once the first slice and the repair are done, by work, before any dive", () => {
    for (const [i, { cluster, optimum }] of events.entries()) {
      const progress: PlanProgress[] = [];
      // No dives and no branching: what the first second holds, measured in work.
      const plan = planner.plan(cluster, {
        timeLimitMs: 120_000,
        budget: { exactNodes: QUICK_NODES, diveNodes: 0, mipNodes: 0 },
        onProgress: (p) => progress.push(p),
      });
      const at = `event ${i}`;
      expect(["optimal", "feasible"], at).toContain(plan.status);
      expect(planDefect(cluster, plan.moves), at).toBeUndefined();
      expect(progress.find((p) => p.best !== undefined)?.phase, at).toBe("repair");
      expect(plan.moveCount, at).toBeGreaterThanOrEqual(optimum);
    }
  });
});

describe("an event with no valid placement", () => {
  const cluster = parseSnapshotText(readFileSync(new URL("fixtures/no-room-2048gpu.json", import.meta.url), "utf8"), "no-room");

  it("gets HiGHS's proof and its best effort once the repair fails, not a search until the limit", () => {
    expect(repair(new CountState(cluster))).toBeUndefined();
    const progress: PlanProgress[] = [];
    // The exact search alone, unbounded in nodes, would run out the limit and answer nothing.
    const plan = planner.plan(cluster, { timeLimitMs: 120_000, budget: { diveNodes: 0, mipNodes: 200_000 }, onProgress: (p) => progress.push(p) });
    expect(plan.status).toBe("optimal");
    expect(plan.bestEffort?.racks.some((r) => r.cause === "no-room")).toBe(true);
    // Every rack the best effort leaves over its bound is named.
    const over = plan.fragmentation.after.flatMap((d, t) => (d > cluster.lambda ? [t] : []));
    expect(plan.bestEffort?.racks.map((r) => r.index)).toEqual(over);
    expect(progress.map((p) => p.phase)).toEqual(["search", "ilp"]);
  });
});
