import { describe, expect, it } from "vitest";
import { moveEvents, quantile, systemReport } from "../../controller/simulator/report.ts";
import type { SystemRun } from "../../controller/simulator/simulate.ts";

describe("simulation reports", () => {
  it("takes nearest-rank quantiles", () => {
    const values = Array.from({ length: 100 }, (_, i) => i + 1);
    expect(quantile(values, 0.5)).toBe(50);
    expect(quantile(values, 0.99)).toBe(99);
    expect(quantile([7], 0.99)).toBe(7);
    expect(quantile([], 0.5)).toBe(0);
  });

  it("counts only plans that moved workers as defragmentation events", () => {
    const plan = (moves: number) => ({ time: 0, status: moves ? "optimal" : "unchanged", moves, solveMs: 1 });
    const events = moveEvents([1, 2, 2, 0, 5, 1].map(plan));
    expect(events).toEqual({ count: 5, moves: { avg: 11 / 5, shareOneOrTwo: 4 / 5, histogram: { "1": 2, "2": 2, "5": 1 } } });
    expect(moveEvents([])).toEqual({ count: 0, moves: { avg: 0, shareOneOrTwo: 0, histogram: {} } });
  });

  it("sums a system's moves and reports its slowdowns", () => {
    const job = (id: string, slowdown: number, moves: number) => ({ id, arrival: 0, start: 0, finish: slowdown, ideal: 1, slowdown, moves });
    const run: SystemRun = {
      system: "monkeytree",
      jobs: [job("a", 1, 0), job("b", 1.5, 2), job("c", 2, 1)],
      plans: [{ time: 0, status: "optimal", moves: 3, solveMs: 4 }],
      migrationSeconds: [10, 12],
      bytesMoved: 30,
      makespanSeconds: 2,
      fragmentation: { peakMaxRack: 3, meanMaxRack: 1, meanRack: 0.5, peakTotal: 6, meanTotal: 4, meanFragmentedGroups: 2 },
    };
    const report = systemReport(run, 0.9);
    expect(report.slowdown).toEqual({ avg: 1.5, p50: 1.5, p90: 2, p99: 2 });
    expect(report.migrations).toBe(3);
    expect(report.migrationsPerJob).toEqual({ avg: 1, max: 2 });
    expect(report.migrationSeconds).toEqual({ avg: 11, p50: 10, p90: 12, p99: 12 });
    expect(report.solver).toEqual({ plans: 1, stale: 0, totalMs: 4, p50Ms: 4, p99Ms: 4 });
  });
});
