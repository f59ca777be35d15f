import { readFileSync } from "node:fs";
import { beforeAll, describe, expect, it, vi } from "vitest";
import type { Cluster } from "../../controller/planner/model/index.ts";
import { createPlanner, PlanTimeoutError, type Plan, type PlanBudget, type Planner, type PlanProgress } from "../../controller/planner/plan/index.ts";
import { trace } from "../../controller/simulator/index.ts";
import { hardInstance, infeasibleInstance, minimumMoves, planDefect, threeTierCluster, type HardInstance } from "./oracle.ts";

let planner: Planner;
beforeAll(async () => {
  planner = await createPlanner();
});

// Which phase settles a plan is forced by work caps (`budget`), never by the clock: the time
// limit below is one no loaded CI machine reaches on clusters this small.
const TIME_LIMIT_MS = 120_000;

const flat = Array.from({ length: 24 }, (_, i) => hardInstance(i + 1));
const podded = Array.from({ length: 6 }, (_, i) => hardInstance(i + 1, true));

type Path = "first search" | "dive" | "ilp";

interface Run {
  readonly plan: Plan;
  readonly events: readonly PlanProgress[];
  readonly path: Path;
}

/** The search's and the ILP's phases, with the quick repair left out (`repair.test.ts` has it). */
function run(cluster: Cluster, budget?: PlanBudget): Run {
  const events: PlanProgress[] = [];
  const plan = planner.plan(cluster, { timeLimitMs: TIME_LIMIT_MS, onProgress: (p) => events.push(p), budget: { repairSteps: 0, ...budget } });
  const path = events.length === 0 ? "first search" : events.at(-1)!.phase === "ilp" ? "ilp" : "dive";
  return { plan, events, path };
}

/**
 * Runs `body` as on a machine many times slower: 10 ms pass at every reading of the clock, so
 * a slice of the schedule that the clock ends (500 ms) ends after a few thousand nodes.
 */
function racingClock<T>(body: () => T): T {
  const now = performance.now.bind(performance);
  let readings = 0;
  const clock = vi.spyOn(performance, "now").mockImplementation(() => now() + 10 * readings++);
  try {
    return body();
  } finally {
    clock.mockRestore();
  }
}

/** What every plan must satisfy, checked against the oracle's minimum. */
function checkPlan({ plan, events }: Run, { seed, cluster, minimum }: HardInstance): void {
  const at = `seed ${seed}`;
  expect(planDefect(cluster, plan.moves), at).toBeUndefined();
  expect(plan.moveCount, at).toBe(plan.moves.length);
  expect(["optimal", "feasible"], at).toContain(plan.status);
  if (plan.status === "optimal") {
    expect(plan.moveCount, at).toBe(minimum);
    expect(plan.lowerBound, at).toBe(minimum);
  } else {
    expect(plan.moveCount, at).toBeGreaterThanOrEqual(minimum);
    expect(plan.lowerBound, at).toBeLessThanOrEqual(minimum);
  }
  checkProgress(events, minimum, at);
  if (events.length > 0) {
    const last = events.at(-1)!;
    expect(plan.lowerBound, at).toBeGreaterThanOrEqual(last.lowerBound);
    if (last.best !== undefined) expect(plan.moveCount, at).toBeLessThanOrEqual(last.best);
  }
}

/**
 * Progress comes in phase order (a first exact pass, a dive, the exact search again, wider
 * dives, the ILP; any may be missing), with a lower bound that never falls and never passes
 * the true minimum, and a best plan that never grows and never beats it.
 */
function checkProgress(events: readonly PlanProgress[], minimum: number, at: string): void {
  expect(events.map((e) => e.phase).join(" "), at).toMatch(/^(search( dive)?( search)?( dive){0,2}( ilp)?)?$/);
  events.forEach((e, i) => {
    expect(e.lowerBound, at).toBeGreaterThanOrEqual(1);
    expect(e.lowerBound, at).toBeLessThanOrEqual(minimum);
    if (e.best !== undefined) expect(e.best, at).toBeGreaterThanOrEqual(minimum);
    const before = events[i - 1];
    if (!before) return;
    expect(e.lowerBound, at).toBeGreaterThanOrEqual(before.lowerBound);
    expect(e.elapsedMs, at).toBeGreaterThanOrEqual(before.elapsedMs);
    if (before.best !== undefined) expect(e.best, at).toBeLessThanOrEqual(before.best);
  });
}

function tally(runs: readonly Run[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const { path, plan } of runs) counts[`${path}, ${plan.status}`] = (counts[`${path}, ${plan.status}`] ?? 0) + 1;
  return counts;
}

describe("the oracle's instances", () => {
  it("need 3 to 6 moves, with every count from 3 to 6 represented", () => {
    const minima = new Set([...flat, ...podded].map((i) => i.minimum));
    expect([...minima].sort()).toEqual([3, 4, 5, 6]);
  });
});

// Each scenario caps the phases so that the instances take one path, and asserts how many took
// it: a change to the generator or the planner that stops reaching a phase fails here.
describe.each([
  { name: "flat", instances: flat, cap: 20, dives: 4, ilps: 6, feasibles: 8 },
  { name: "3-tier", instances: podded, cap: 10, dives: 2, ilps: 1, feasibles: 2 },
])("planner phases against brute force, $name clusters that need 3–6 moves", ({ instances, cap, dives, ilps, feasibles }) => {
  const runAll = (budget: PlanBudget | undefined) =>
    instances.map((instance) => {
      const outcome = run(instance.cluster, budget);
      checkPlan(outcome, instance);
      return outcome;
    });
  const scenario = (budget: PlanBudget | undefined) => tally(runAll(budget));

  it("uncapped, the first exact search proves every one optimal", () => {
    expect(scenario(undefined)).toEqual({ "first search, optimal": instances.length });
  });

  it(`with the exact search capped at ${cap} nodes, at least ${dives} plans are proved after a dive and ${ilps} by the ILP`, () => {
    const counts = scenario({ exactNodes: cap });
    expect(counts["dive, optimal"] ?? 0).toBeGreaterThanOrEqual(dives);
    expect(counts["ilp, optimal"] ?? 0).toBeGreaterThanOrEqual(ilps);
    expect(counts["first search, optimal"] ?? 0).toBeLessThan(instances.length / 2);
  });

  it("with no exact search, every plan is the ILP's, started from the dive's incumbent", () => {
    const runs = runAll({ exactNodes: 0 });
    expect(tally(runs)).toEqual({ "ilp, optimal": instances.length });
    for (const { events } of runs) expect(events.find((e) => e.phase === "ilp")?.best).toBeDefined();
  });

  it("with neither exact search nor dives, the ILP alone finds the optimum", () => {
    const runs = runAll({ exactNodes: 0, diveNodes: 0 });
    expect(tally(runs)).toEqual({ "ilp, optimal": instances.length });
    for (const { events } of runs) expect(events.some((e) => e.best !== undefined)).toBe(false);
  });

  it(`when HiGHS may not branch, at least ${feasibles} plans come back feasible, keeping the search's lower bound`, () => {
    const runs = runAll({ exactNodes: cap, mipNodes: 0 });
    expect(tally(runs)["ilp, feasible"] ?? 0).toBeGreaterThanOrEqual(feasibles);
    // The bound a feasible plan reports is the exact search's, not the trivial one.
    expect(runs.some(({ plan }) => plan.status === "feasible" && plan.lowerBound > 1)).toBe(true);
  });

  it("with no phase allowed any work, PlanTimeoutError carries a valid lower bound", () => {
    for (const { seed, cluster, minimum } of instances) {
      let thrown: unknown;
      try {
        run(cluster, { exactNodes: 0, diveNodes: 0, mipNodes: 0 });
      } catch (error) {
        thrown = error;
      }
      expect(thrown, `seed ${seed}`).toBeInstanceOf(PlanTimeoutError);
      const error = thrown as PlanTimeoutError;
      expect(error.code).toBe("plan_timeout");
      expect(error.lowerBound).toBeGreaterThanOrEqual(1);
      expect(error.lowerBound).toBeLessThanOrEqual(minimum);
      expect(error.message).toBe(
        `no plan found within ${TIME_LIMIT_MS / 1000} s and the work budget (at least ${error.lowerBound} moves are needed); raise the budget or --time-limit`,
      );
    }
  });
});

describe("a plan under a work budget", () => {
  // An event of fig-slowdown (seed 1, 1,000 jobs, MonkeyTree-Crux at 100% load) whose proof
  // takes the exact search millions of nodes: every phase runs, and ends by its cap.
  const event = JSON.parse(readFileSync(new URL("fixtures/sim-event-1024.json", import.meta.url), "utf8")) as Cluster;
  const budget = { exactNodes: 300_000, diveNodes: 50_000, mipNodes: 0 };
  const path = ({ plan, events }: Run) => ({
    moves: plan.moves,
    status: plan.status,
    lowerBound: plan.lowerBound,
    events: events.map(({ phase, lowerBound, best }) => ({ phase, lowerBound, best })),
  });

  it("takes the same path to the same plan however slow the machine", () => {
    const steady = path(run(event, budget));
    expect(steady.events.map((e) => e.phase)).toEqual(["search", "dive", "dive", "dive", "search", "ilp"]);
    expect(racingClock(() => path(run(event, budget)))).toEqual(steady);
  });
});

describe("infeasibility against brute force", () => {
  // Infeasible without any one group ruling it out, so only an exhausted search or the ILP can
  // say so. (HiGHS needs tens of seconds to prove it on 5 racks of 4 hosts, so these are small.)
  const clusters = Array.from({ length: 6 }, (_, i) => infeasibleInstance(i + 1));

  it.each([
    ["uncapped", undefined],
    ["with no exact search", { exactNodes: 0 }],
  ] as const)("%s, every such cluster is reported infeasible by the ILP, with no moves", (_, budget) => {
    for (const cluster of clusters) {
      const { plan } = run(cluster, budget);
      expect(plan).toMatchObject({ status: "infeasible", method: "ilp", moves: [] });
      expect(plan.reason).toBeUndefined();
    }
  });

  it("with no work allowed, a cluster is reported infeasible or the planner gives up, never a plan", () => {
    let gaveUp = 0;
    for (const cluster of clusters) {
      try {
        expect(run(cluster, { exactNodes: 0, diveNodes: 0, mipNodes: 0 }).plan.status).toBe("infeasible");
      } catch (error) {
        expect(error).toBeInstanceOf(PlanTimeoutError);
        gaveUp++;
      }
    }
    expect(gaveUp).toBeLessThan(clusters.length);
  });
});

describe("the pod-level rule against brute force", () => {
  // 3-tier clusters with groups larger than a pod: such a group spans pods whatever the plan,
  // so its rings alone above pod λ rule out every placement; at or below it they do not.
  const clusters = Array.from({ length: 40 }, (_, i) => threeTierCluster(i + 1));
  const podHosts = (c: Cluster) => c.topology.hostsPerRack * c.topology.racksPerPod!;
  const spansPods = (c: Cluster) => c.groups.filter((_, g) => c.placement[g]!.length > podHosts(c));

  it.each([
    ["uncapped", undefined],
    ["with no exact search", { exactNodes: 0 }],
  ] as const)("%s, infeasible exactly when the oracle finds no placement, and optimal otherwise", (_, budget) => {
    let byPodRule = 0;
    let spanningPlanned = 0;
    clusters.forEach((cluster, i) => {
      const at = `seed ${i + 1}`;
      const minimum = minimumMoves(cluster);
      const { plan } = run(cluster, budget);
      if (minimum === Number.POSITIVE_INFINITY) {
        expect(plan.status, at).toBe("infeasible");
        if (plan.reason?.includes("pod λ")) byPodRule++;
        return;
      }
      expect(planDefect(cluster, plan.moves), at).toBeUndefined();
      expect(plan.moveCount, at).toBe(minimum);
      expect(plan.status, at).toBe(minimum === 0 ? "unchanged" : "optimal");
      if (spansPods(cluster).length > 0) spanningPlanned++;
    });
    expect(byPodRule).toBeGreaterThanOrEqual(5);
    expect(spanningPlanned).toBeGreaterThanOrEqual(3);
  });

  it("names the group, its size, the pod's and the bound", () => {
    const cluster = clusters.find((c) => run(c).plan.reason?.includes("pod λ"))!;
    // The rule names the first group that breaks it, here one no rack rule caught first.
    const g = cluster.groups.findIndex((group, i) => cluster.placement[i]!.length > podHosts(cluster) && group.rings > cluster.podLambda!);
    const group = cluster.groups[g]!;
    const name = `job "${group.job}"${group.index > 0 ? ` group ${group.index}` : ""}`;
    expect(run(cluster).plan.reason).toBe(
      `${name} has ${cluster.placement[g]!.length} hosts, more than a pod's ${podHosts(cluster)}, so it spans pods and adds its ${group.rings} rings to each, above pod λ = ${cluster.podLambda}`,
    );
  });
});

describe("the ILP against the exact search and the paper's program, beyond brute force", () => {
  // 64 hosts in pods of two racks: too many placements to enumerate, so the forced ILP is
  // held against two other methods, the uncapped exact search (which proves its optimum) and
  // the paper's program (which may only do worse, moving fragmented groups alone).
  it("plans every event of a 3-tier DP trace with the exact search's optimum, never more than the paper's", () => {
    const events = trace({
      seed: 12,
      topology: { racks: 8, hostsPerRack: 8, gpusPerHost: 8, uplinksPerRack: 2, racksPerPod: 2 },
      podLambda: 2,
      mix: "dp",
      events: 9,
    });
    let longest = 0;
    let paperLonger = 0;
    for (let step = events.next(undefined); !step.done;) {
      const cluster = step.value;
      // Proved by the search, in its first slice or after dives: which depends on the
      // machine's speed when the clock ends the slice, the optimum does not.
      const exact = run(cluster);
      expect([exact.plan.status, exact.plan.method]).toEqual(["optimal", "search"]);
      const ilp = run(cluster, { exactNodes: 0, diveNodes: 0 });
      expect(ilp.path).toBe("ilp");
      expect(planDefect(cluster, ilp.plan.moves)).toBeUndefined();
      expect(ilp.plan).toMatchObject({ status: "optimal", moveCount: exact.plan.moveCount, lowerBound: exact.plan.moveCount });
      const paper = planner.plan(cluster, { formulation: "paper", timeLimitMs: TIME_LIMIT_MS });
      expect(paper.status).toBe("optimal");
      expect(paper.moveCount).toBeGreaterThanOrEqual(ilp.plan.moveCount);
      if (paper.moveCount > ilp.plan.moveCount) paperLonger++;
      longest = Math.max(longest, exact.plan.moveCount);
      step = events.next(exact.plan.placement);
    }
    // The trace reaches well past what brute force could check, and where the paper's program
    // is beaten (it cannot move whole groups out of the way).
    expect(longest).toBeGreaterThanOrEqual(7);
    expect(paperLonger).toBeGreaterThanOrEqual(1);
  });
});
