import { beforeAll, describe, expect, it } from "vitest";
import { parseSnapshot, toSnapshot, type Cluster } from "../../controller/planner/model/index.ts";
import { applyMoves, createPlanner, PlanError, type Plan, type PlanBudget, type Planner } from "../../controller/planner/plan/index.ts";
import { syntheticCluster } from "../../controller/simulator/synthetic.ts";
import { bestEffortMinimum, boundDefect, minimumMoves, pinnedFloors, pinnedInstance, planDefect } from "./oracle.ts";

let planner: Planner;
beforeAll(async () => {
  planner = await createPlanner();
});

// Outcomes, not speed, are under test: a limit no loaded CI machine reaches on clusters this small.
const TIME_LIMIT_MS = 120_000;
/** The same placement with every host available and every job movable. */
const unpinned = (cluster: Cluster): Cluster => {
  const snapshot = toSnapshot(cluster);
  return parseSnapshot({ ...snapshot, unavailable: [], jobs: snapshot.jobs.map((job) => ({ ...job, movable: true })) });
};
const plan = (cluster: Cluster, budget?: PlanBudget): Plan => planner.plan(cluster, { timeLimitMs: TIME_LIMIT_MS, ...(budget ? { budget } : {}) });

describe("pinned jobs and unavailable hosts against brute force", () => {
  const instances = Array.from({ length: 80 }, (_, i) => ({ seed: i + 1, ...pinnedInstance(i + 1) }));

  it("the instances cover pins, held unavailable hosts, best-effort racks, moves and infeasibility", () => {
    const some = (f: (i: (typeof instances)[number]) => boolean) => instances.filter(f).length;
    expect(some(({ cluster }) => cluster.groups.some((g) => !g.movable))).toBeGreaterThanOrEqual(40);
    expect(some(({ cluster }) => cluster.unavailable.some((h) => cluster.placement.some((hosts) => hosts.includes(h))))).toBeGreaterThanOrEqual(20);
    expect(some(({ cluster }) => pinnedFloors(cluster).length > 0)).toBeGreaterThanOrEqual(5);
    expect(some(({ minimum }) => minimum >= 2 && minimum < Number.POSITIVE_INFINITY)).toBeGreaterThanOrEqual(10);
    expect(some(({ minimum }) => minimum === Number.POSITIVE_INFINITY)).toBeGreaterThanOrEqual(1);
  });

  it.each([
    ["the exact search", undefined],
    ["the integer program (no exact search)", { exactNodes: 0 }],
    ["the integer program alone (no search, no dives)", { exactNodes: 0, diveNodes: 0 }],
  ] as const)("%s: the oracle's minimum, a plan that keeps pins and unavailable hosts, and the best-effort racks named", (_, budget) => {
    let roomless = 0;
    for (const { seed, cluster, minimum } of instances) {
      const at = `seed ${seed}`;
      const result = plan(cluster, budget);
      const floors = pinnedFloors(cluster);
      const pinnedOver = result.bestEffort?.racks.filter((r) => r.cause === "pinned") ?? [];
      expect(
        pinnedOver.map(({ index, pinned }) => ({ index, pinned })),
        at,
      ).toEqual(floors);
      if (minimum === Number.POSITIVE_INFINITY) {
        // No placement meets the bounds on the hosts a plan may use: the least excess over
        // the rack bounds, then the fewest moves, with every such rack named.
        const best = bestEffortMinimum(cluster);
        if (best.excess === Number.POSITIVE_INFINITY || minimumMoves(unpinned(cluster)) === Number.POSITIVE_INFINITY) {
          // Infeasible whatever hosts and jobs were freed: not for want of room.
          expect(result.status, at).toBe("infeasible");
          expect(result.bestEffort?.racks.some((r) => r.cause === "no-room") ?? false, at).toBe(false);
          continue;
        }
        expect(result.status, at).toBe("optimal");
        expect(result.moveCount, at).toBe(best.moves);
        expect(boundDefect(cluster, applyMoves(cluster, result.moves)), at).toBeDefined();
        // Every rack left over its planned bound (λ, or its pinned floor) is named, and what
        // they carry over it, summed, is the oracle's least.
        const racks = result.bestEffort!.racks;
        const bound = (index: number) => floors.find((f) => f.index === index)?.pinned ?? cluster.lambda;
        const after = result.fragmentation.after;
        const over = after.flatMap((d, t) => (d > bound(t) ? [t] : []));
        expect(
          over.every((t) => racks.some((r) => r.index === t && r.after === after[t])),
          at,
        ).toBe(true);
        expect(
          over.reduce((sum, t) => sum + after[t]! - bound(t), 0),
          at,
        ).toBe(best.excess);
        roomless++;
        continue;
      }
      expect(result.bestEffort?.racks.some((r) => r.cause === "no-room") ?? false, at).toBe(false);
      if (floors.length === 0) expect(result.bestEffort, at).toBeUndefined();
      expect(planDefect(cluster, result.moves), at).toBeUndefined();
      expect(result.moveCount, at).toBe(minimum);
      expect(result.status, at).toBe(minimum === 0 ? "unchanged" : "optimal");
      // What the best effort leaves: exactly the pinned floor on each such rack.
      for (const residual of result.bestEffort?.racks ?? []) expect(residual.after, at).toBe(residual.pinned);
    }
    expect(roomless).toBeGreaterThanOrEqual(1);
  });

  it("the paper's program never beats the minimum and keeps the same rules", () => {
    for (const { seed, cluster, minimum } of instances) {
      if (minimum === 0) continue;
      const paper = planner.plan(cluster, { formulation: "paper", timeLimitMs: TIME_LIMIT_MS });
      if (paper.status === "infeasible") continue;
      expect(planDefect(cluster, paper.moves), `seed ${seed}`).toBeUndefined();
      expect(paper.moveCount, `seed ${seed}`).toBeGreaterThanOrEqual(minimum);
    }
  });
});

describe("pinned jobs and unavailable hosts, by example", () => {
  const topology = { racks: 3, hostsPerRack: 4, gpusPerHost: 8, uplinksPerRack: 1 };

  it("holds a rack that pinned jobs alone keep over λ to their floor, and says so", () => {
    // Pinned a and b span racks 0 and 1 (degree 2 from them alone, λ = 1); movable c spans
    // racks 0 and 2 and must come off rack 0, or gather, for rack 0 to reach its floor.
    const cluster = parseSnapshot({
      topology,
      lambda: 1,
      jobs: [
        { id: "a", hosts: [0, 4], movable: false },
        { id: "b", hosts: [1, 5], movable: false },
        { id: "c", hosts: [2, 8, 9] },
      ],
    });
    expect(minimumMoves(cluster)).toBe(1);
    const result = plan(cluster);
    expect(result).toMatchObject({ status: "optimal", moveCount: 1 });
    expect(result.moves[0]).toMatchObject({ job: "c", from: 2 });
    expect(result.bestEffort).toEqual({
      racks: [
        { index: 0, cause: "pinned", pinned: 2, after: 2 },
        { index: 1, cause: "pinned", pinned: 2, after: 2 },
      ],
      pods: [],
    });
    expect(result.fragmentation).toEqual({ before: [3, 2, 1], after: [2, 2, 0] });
  });

  it("answers unchanged, still naming the racks, when nothing movable adds to them", () => {
    const cluster = parseSnapshot({
      topology,
      lambda: 0,
      jobs: [
        { id: "a", hosts: [0, 4], movable: false },
        { id: "b", hosts: [8, 9] },
      ],
    });
    expect(plan(cluster)).toMatchObject({
      status: "unchanged",
      moves: [],
      bestEffort: {
        racks: [
          { index: 0, cause: "pinned", pinned: 1, after: 1 },
          { index: 1, cause: "pinned", pinned: 1, after: 1 },
        ],
        pods: [],
      },
    });
  });

  it("lets a worker on an unavailable host stay, and never lands one there", () => {
    // b's worker on host 4 (unavailable) stays. a (hosts 0, 8) must gather: rack 0 has only
    // unavailable room, so a's worker on rack 0 goes to rack 2.
    const cluster = parseSnapshot({
      topology,
      lambda: 0,
      unavailable: [3, 4],
      jobs: [
        { id: "a", hosts: [0, 8] },
        { id: "b", hosts: [4, 5, 6, 7] },
        { id: "c", hosts: [1, 2] },
      ],
    });
    const result = plan(cluster);
    expect(result).toMatchObject({ status: "optimal", moveCount: 1, moves: [{ job: "a", from: 0, to: 9 }] });
    expect(result.placement[1]).toEqual([4, 5, 6, 7]);
  });

  it("leaves the least it must over λ when the only room is on unavailable hosts, and says so", () => {
    // a must gather on one rack; rack 0's other host runs pinned b, rack 1's is unavailable.
    const doc = {
      topology: { racks: 2, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 1 },
      lambda: 0,
      jobs: [
        { id: "a", hosts: [0, 2] },
        { id: "b", hosts: [1], movable: false },
      ],
    };
    const cluster = parseSnapshot({ ...doc, unavailable: [3] });
    expect(minimumMoves(cluster)).toBe(Number.POSITIVE_INFINITY);
    expect(bestEffortMinimum(cluster)).toEqual({ excess: 2, moves: 0 });
    expect(plan(cluster)).toMatchObject({
      status: "optimal",
      moves: [],
      bestEffort: {
        racks: [
          { index: 0, cause: "no-room", pinned: 0, after: 1 },
          { index: 1, cause: "no-room", pinned: 0, after: 1 },
        ],
        pods: [],
      },
    });
    // With host 3 available, one move gathers a there.
    expect(plan(parseSnapshot(doc))).toMatchObject({ status: "optimal", moveCount: 1, moves: [{ job: "a", from: 0, to: 3 }] });
  });

  it("the plan checker refuses a move of a pinned job and a move onto an unavailable host", () => {
    const cluster = parseSnapshot({
      topology,
      unavailable: [11],
      jobs: [
        { id: "a", hosts: [0, 4], movable: false },
        { id: "b", hosts: [8] },
      ],
    });
    expect(() => applyMoves(cluster, [{ job: "a", group: 0, from: 4, to: 1, step: 0 }])).toThrow(
      new PlanError('step 0, move a[0] 4→1: job "a" is pinned (movable: false)'),
    );
    expect(() => applyMoves(cluster, [{ job: "b", group: 0, from: 8, to: 11, step: 0 }])).toThrow(
      new PlanError("step 0, move b[0] 8→11: the destination is unavailable"),
    );
    expect(applyMoves(cluster, [{ job: "b", group: 0, from: 8, to: 10, step: 0 }])[1]).toEqual([10]);
  });
});

describe("a snapshot within its bounds", () => {
  it("is answered unchanged, with its fragmentation, whatever its size", () => {
    const cluster = syntheticCluster({ racks: 256, hostsPerRack: 8, uplinksPerRack: 8, rings: 1, fill: 0.95 }, 7);
    const result = planner.plan(cluster);
    expect(result).toMatchObject({ status: "unchanged", moves: [], method: "none", placement: cluster.placement });
    expect(result.fragmentation.after).toEqual(result.fragmentation.before);
    expect(Math.max(...result.fragmentation.before)).toBeLessThanOrEqual(cluster.lambda);
    expect(Math.max(...result.fragmentation.before)).toBeGreaterThan(0);
  });
});
