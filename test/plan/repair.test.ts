import { readFileSync } from "node:fs";
import { beforeAll, describe, expect, it } from "vitest";
import { parseSnapshot, parseSnapshotText, toSnapshot, type Cluster } from "../../controller/model/index.ts";
import { countsOf, CountState, moveDistance } from "../../controller/plan/counts.ts";
import { createPlanner, type PlanProgress, type Planner } from "../../controller/plan/index.ts";
import { repair } from "../../controller/plan/repair.ts";
import { Search } from "../../controller/plan/search.ts";
import { Random, trace } from "../../controller/sim/index.ts";
import { planDefect } from "./oracle.ts";

let planner: Planner;
beforeAll(async () => {
  planner = await createPlanner();
});

/** Nodes a quick exact search gets to tell the easy events from the hard. */
const QUICK_NODES = 20_000;

/**
 * The hardest events we generate: 2,048 GPUs at λ = 2, a full cluster (0–4 free hosts), about
 * a third of the jobs pinned and a quarter of the free hosts unavailable, kept where a quick
 * exact search finds no plan but a valid placement exists (HiGHS, given the time, finds one).
 * The trace goes on from each event's planned placement.
 */
function hardEvents(count: number): Cluster[] {
  const events = trace({ seed: 1, topology: { racks: 32, hostsPerRack: 8, gpusPerHost: 8, uplinksPerRack: 2 }, lambda: 2, mix: "dp", events: count });
  const hard: Cluster[] = [];
  for (let i = 0, step = events.next(undefined); !step.done; i++) {
    const cluster = step.value;
    const random = new Random(1000 + i);
    const used = new Set(cluster.placement.flat());
    const snapshot = toSnapshot(cluster);
    const unavailable = Array.from({ length: cluster.hostCount }, (_, h) => h).filter((h) => !used.has(h) && random.float() < 0.25);
    const pinned = parseSnapshot({ ...snapshot, jobs: snapshot.jobs.map((job) => (random.float() < 1 / 3 ? { ...job, movable: false } : job)), unavailable });
    if (new Search(new CountState(pinned), { nodeLimit: QUICK_NODES }).run(12, Number.POSITIVE_INFINITY).kind !== "found") {
      const settled = planner.plan(pinned, { timeLimitMs: 120_000, budget: { exactNodes: 0 } });
      if (settled.status !== "infeasible" && !settled.bestEffort) hard.push(pinned);
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

describe("the planner's first plan on the hardest events", () => {
  let events: Cluster[] = [];
  beforeAll(() => {
    events = hardEvents(30);
  }, 120_000);

  it("the events are hard: full racks, pinned jobs, unavailable hosts, no quick exact plan", () => {
    expect(events.length).toBeGreaterThanOrEqual(3);
    for (const cluster of events) {
      expect(cluster.groups.some((g) => !g.movable)).toBe(true);
      expect(cluster.unavailable.length + cluster.placement.flat().length).toBeGreaterThanOrEqual(cluster.hostCount - 4);
    }
  });

  it("has a valid plan once the first slice and the repair are done, by work, before any dive", () => {
    for (const [i, cluster] of events.entries()) {
      const progress: PlanProgress[] = [];
      // No dives and no branching: what the first second holds, measured in work.
      const plan = planner.plan(cluster, { timeLimitMs: 120_000, budget: { exactNodes: QUICK_NODES, diveNodes: 0, mipNodes: 0 }, onProgress: (p) => progress.push(p) });
      const at = `event ${i}`;
      expect(["optimal", "feasible"], at).toContain(plan.status);
      expect(planDefect(cluster, plan.moves), at).toBeUndefined();
      expect(progress.find((p) => p.best !== undefined)?.phase, at).toBe("repair");
    }
  });
});
