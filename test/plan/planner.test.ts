import { readFileSync } from "node:fs";
import { beforeAll, describe, expect, it } from "vitest";
import { parseSnapshot, parseSnapshotText, withinBounds } from "../../controller/planner/model/index.ts";
import { applyMoves, createPlanner, MAX_PROGRAM_CELLS, type Planner } from "../../controller/planner/plan/index.ts";
import { bruteForceMoves, hostsOf, smallCluster } from "../helpers/clusters.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";

let planner: Planner;
beforeAll(async () => {
  planner = await createPlanner();
});

const example = (path: string) => parseSnapshotText(readFileSync(new URL(`../../${path}`, import.meta.url), "utf8"), path);

describe("planner on the design examples", () => {
  it.each([
    ["cli/snapshots/dp-1024gpu-lambda2.json", 2],
    ["examples/snapshots/tp8-pp-1024gpu.json", 4],
  ])("%s: matches the known optimum of %i moves, proved", (name, optimum) => {
    const cluster = example(name);
    for (const formulation of ["monkeytree", "paper"] as const) {
      // Outcomes, not speed, are under test: a budget no loaded CI machine runs out of.
      const plan = planner.plan(cluster, { formulation, timeLimitMs: 120_000 });
      expect(plan.status).toBe("optimal");
      expect(plan.moveCount).toBe(optimum);
      expect(plan.lowerBound).toBe(optimum);
      expect(withinBounds(cluster, applyMoves(cluster, plan.moves))).toBe(true);
    }
  });

  it("proves the hard 2,048-GPU event's optimum of 8 moves", () => {
    const cluster = example("cli/snapshots/hard-2048gpu-lambda2.json");
    const plan = planner.plan(cluster, { timeLimitMs: 120_000 });
    expect(plan).toMatchObject({ status: "optimal", moveCount: 8, lowerBound: 8, method: "search" });
    expect(withinBounds(cluster, applyMoves(cluster, plan.moves))).toBe(true);
  });

  it("is deterministic", () => {
    const cluster = example("examples/snapshots/tp8-pp-1024gpu.json");
    expect(planner.plan(cluster).moves).toEqual(planner.plan(cluster).moves);
  });
});

describe("planner semantics", () => {
  it("reports unchanged when every rack is within bound", () => {
    const cluster = parseSnapshot({
      topology: { racks: 2, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 1 },
      jobs: [{ id: "a", hosts: [0, 2] }],
    });
    const plan = planner.plan(cluster);
    expect(plan).toMatchObject({ status: "unchanged", moveCount: 0, moves: [], method: "none" });
  });

  it("moves a whole unfragmented job out of a full rack when the paper's program cannot", () => {
    // Rack 0 is full: job "a" (fragmented, 3 hosts on rack 0, 1 on rack 1) and job "small" (1
    // host, whole on rack 0). λ = 0: "a" must become whole. The paper freezes "small", so rack 0
    // has no room for a's fourth worker and rack 1 cannot take a's three; moving "small" to
    // rack 1 and a's last worker to rack 0 takes two moves.
    const cluster = parseSnapshot({
      topology: { racks: 2, hostsPerRack: 4, gpusPerHost: 8, uplinksPerRack: 1 },
      lambda: 0,
      jobs: [
        { id: "a", hosts: [0, 1, 2, 4] },
        { id: "small", hosts: [3] },
        { id: "b", hosts: [5, 6] },
      ],
    });
    expect(planner.plan(cluster, { formulation: "paper", timeLimitMs: 120_000 }).status).toBe("infeasible");
    const plan = planner.plan(cluster);
    expect(plan.status).toBe("optimal");
    expect(plan.moveCount).toBe(2);
    const after = applyMoves(cluster, plan.moves);
    expect(after[1]).toEqual([7]);
    expect(after[0]).toEqual([0, 1, 2, 3]);
    expect(withinBounds(cluster, after)).toBe(true);
  });

  it("runs a swap inside one step", () => {
    // Two half-and-half jobs on two full racks with λ = 0: each needs the other's hosts.
    const cluster = parseSnapshot({
      topology: { racks: 2, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 1 },
      lambda: 0,
      jobs: [
        { id: "a", hosts: [0, 2] },
        { id: "b", hosts: [1, 3] },
      ],
    });
    const plan = planner.plan(cluster);
    expect(plan.status).toBe("optimal");
    expect(plan.moveCount).toBe(2);
    expect(plan.steps).toBe(1);
    const [first, second] = plan.moves;
    // Each destination is the other move's source: neither could run without the other.
    expect(first?.to).toBe(second?.from);
    expect(second?.to).toBe(first?.from);
    expect(withinBounds(cluster, applyMoves(cluster, plan.moves))).toBe(true);
  });

  it("reports infeasible only when no placement meets the bounds", () => {
    // Three racks, two jobs larger than a rack each, λ = 1: the jobs must share a rack, which
    // then carries two fragmented groups (paper §5.1's example).
    const cluster = parseSnapshot({
      topology: { racks: 3, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 1 },
      jobs: [
        { id: "a", hosts: [0, 1, 2] },
        { id: "b", hosts: [3, 4, 5] },
      ],
    });
    expect(bruteForceMoves(cluster)).toBe(Number.POSITIVE_INFINITY);
    const plan = planner.plan(cluster);
    expect(plan.status).toBe("infeasible");
    expect(plan.moves).toEqual([]);
  });

  it("says at once why a group can never fit", () => {
    const cluster = parseSnapshot({
      topology: { racks: 4, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 4 },
      jobs: [{ id: "big", rings: 8, hosts: [0, 1, 2] }],
    });
    expect(bruteForceMoves(cluster)).toBe(Number.POSITIVE_INFINITY);
    const plan = planner.plan(cluster);
    expect(plan.status).toBe("infeasible");
    expect(plan.reason).toBe('job "big" has 3 hosts, more than a rack\'s 2, so it spans racks and adds its 8 rings to each, above λ = 4');
  });

  it("honours the pod bound", () => {
    const cluster = parseSnapshot({
      topology: { racks: 4, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 2, racksPerPod: 2 },
      lambda: 2,
      podLambda: 0,
      jobs: [
        { id: "a", hosts: [0, 4] },
        { id: "b", hosts: [1] },
      ],
    });
    const plan = planner.plan(cluster);
    expect(plan.status).toBe("optimal");
    expect(plan.moveCount).toBe(1);
    expect(plan.podFragmentation?.after).toEqual([0, 0]);
  });
});

describe("planner against brute force on small random clusters", () => {
  const seeds = Array.from({ length: 150 }, (_, i) => i + 1);
  it.each(seeds)("seed %i: optimal move count, valid plan", (seed) => {
    const cluster = smallCluster(seed);
    const optimum = bruteForceMoves(cluster);
    const plan = planner.plan(cluster, { timeLimitMs: 20_000 });
    if (optimum === Number.POSITIVE_INFINITY) {
      expect(plan.status).toBe("infeasible");
      return;
    }
    expect(plan.moveCount).toBe(optimum);
    expect(plan.status).toBe(optimum === 0 ? "unchanged" : "optimal");
    const after = applyMoves(cluster, plan.moves);
    expect(withinBounds(cluster, after)).toBe(true);
    expect(hostsOf(after)).toHaveLength(hostsOf(cluster.placement).length);
    expect(new Set(hostsOf(after)).size).toBe(hostsOf(after).length);
    const paper = planner.plan(cluster, { formulation: "paper", timeLimitMs: 20_000 });
    if (paper.status !== "infeasible") expect(paper.moveCount).toBeGreaterThanOrEqual(plan.moveCount);
  });
});

describe("planner past what HiGHS is given", () => {
  /**
   * 1,024 racks of 16 hosts and 301 groups: 308,224 (group, rack) cells, past
   * MAX_PROGRAM_CELLS. One job of 3 rings spans racks 0 and 1, over λ = 2 on both.
   */
  const large = (racks: number) =>
    parseSnapshot({
      topology: { racks, hostsPerRack: 16, gpusPerHost: 8, uplinksPerRack: 2 },
      jobs: [
        { id: "split", rings: 3, hosts: [0, 16] },
        ...Array.from({ length: 300 }, (_, j) => ({ id: `j${j}`, hosts: [(j % racks) * 16 + 2 + Math.floor(j / racks)] })),
      ],
    });

  // Its two plans are seconds of work on an idle machine and near a minute on a loaded one.
  it(
    "plans by the search and the repair alone, and never hands HiGHS the program",
    () => {
      const cluster = large(1_024);
      expect(cluster.groups.length * cluster.topology.racks).toBeGreaterThan(MAX_PROGRAM_CELLS);
      const phases: string[] = [];
      // No exact search and no dives: HiGHS would be next, were the program small enough.
      const plan = planner.plan(cluster, { timeLimitMs: 120_000, budget: { exactNodes: 0, diveNodes: 0 }, onProgress: (p) => phases.push(p.phase) });
      expect(plan.moveCount).toBe(1);
      expect(withinBounds(cluster, applyMoves(cluster, plan.moves))).toBe(true);
      expect(phases).not.toContain("ilp");
      // The same event on 64 racks is small enough, and HiGHS gets its turn.
      const small: string[] = [];
      planner.plan(large(64), { timeLimitMs: 120_000, budget: { exactNodes: 0, diveNodes: 0 }, onProgress: (p) => small.push(p.phase) });
      expect(small).toContain("ilp");
    },
    SAFETY_NET_MS,
  );

  it("refuses the paper's program that large, naming the way out", () => {
    expect(() => planner.plan(large(1_024), { formulation: "paper" })).toThrow(
      /larger than HiGHS is given \(262144 cells\); plan with --formulation monkeytree/,
    );
  });
});
