import * as highsModule from "highs";
import type { Highs } from "highs";
import { beforeAll, describe, expect, it } from "vitest";
import { CountState, moveDistance } from "../../controller/planner/plan/counts.ts";
import { monkeytreeProgram, paperProgram } from "../../controller/planner/plan/ilp.ts";
import { solveMip } from "../../controller/planner/plan/mip.ts";
import { searchMoves } from "../../controller/planner/plan/search.ts";
import { bruteForceMoves, smallCluster } from "../helpers/clusters.ts";

let highs: Highs;
beforeAll(async () => {
  highs = await (highsModule as unknown as { default: () => Promise<Highs> }).default();
});

// The programs solved directly; phases.test.ts drives them through the planner.
describe("integer programs against brute force", () => {
  it.each(Array.from({ length: 60 }, (_, i) => 1000 + i))("seed %i", (seed) => {
    const cluster = smallCluster(seed);
    const optimum = bruteForceMoves(cluster);
    const state = new CountState(cluster);
    const ours = solveMip(highs, monkeytreeProgram(state).model, { timeLimitSec: 30 });
    if (optimum === Number.POSITIVE_INFINITY) {
      expect(ours.status).toBe("infeasible");
      return;
    }
    expect(ours.status).toBe("optimal");
    const program = monkeytreeProgram(state);
    const counts = program.decode(ours.values!);
    expect(moveDistance(state.count, counts)).toBe(optimum);
    expect(new CountState(cluster, counts).valid).toBe(true);
    // A proven lower bound may be added without changing the optimum.
    const bounded = solveMip(highs, monkeytreeProgram(state, optimum).model, { timeLimitSec: 30, start: program.encode(counts) });
    expect(bounded.objective).toBeCloseTo(optimum);

    const paperProgramOf = paperProgram(state);
    const paper = solveMip(highs, paperProgramOf.model, { timeLimitSec: 30 });
    // The paper's program moves only fragmented groups, so it may have no solution at all, or
    // no variables (HiGHS calls that model empty, which the planner never builds: it answers
    // "unchanged" first).
    expect(paperProgramOf.model.numCols > 0 ? ["optimal", "infeasible"] : ["unknown"]).toContain(paper.status);
    if (paper.status === "optimal") {
      const paperCounts = paperProgramOf.decode(paper.values!);
      expect(new CountState(cluster, paperCounts).valid).toBe(true);
      expect(moveDistance(state.count, paperCounts)).toBeGreaterThanOrEqual(optimum);
      expect(paper.objective! * paperProgramOf.movesPerObjective).toBeCloseTo(moveDistance(state.count, paperCounts));
    }
  });
});

describe("beam dive", () => {
  // A beam may prune every plan in principle; on these clusters it never does, so a dive that
  // stops finding plans fails here rather than passing unchecked.
  it.each(Array.from({ length: 60 }, (_, i) => 2000 + i))("seed %i: finds a valid plan, no shorter than optimal, whenever one exists", (seed) => {
    const cluster = smallCluster(seed);
    const optimum = bruteForceMoves(cluster);
    const outcome = searchMoves(new CountState(cluster), 30, performance.now() + 10_000, { firstDepth: 1, beam: 2 });
    if (optimum === Number.POSITIVE_INFINITY) {
      expect(outcome.kind).toBe("exhausted");
      return;
    }
    expect(outcome.kind).toBe("found");
    if (outcome.kind !== "found") throw new Error("narrowing failed");
    const state = new CountState(cluster);
    for (const move of outcome.moves) state.move(move.group, move.from, move.to);
    expect(state.valid).toBe(true);
    expect(outcome.moves.length).toBeGreaterThanOrEqual(optimum);
  });
});
