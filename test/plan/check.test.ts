import { describe, expect, it } from "vitest";
import { parseSnapshot } from "../../controller/planner/model/index.ts";
import { applyMoves, PlanError, type Move } from "../../controller/planner/plan/index.ts";

const cluster = parseSnapshot({
  topology: { racks: 2, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 1 },
  jobs: [
    { id: "a", hosts: [0] },
    { id: "b", hosts: [1] },
    { id: "c", groups: [[2], [3]] },
  ],
});
const move = (job: string, from: number, to: number, step = 0, group = 0): Move => ({ job, group, from, to, step });

describe("plan contract (applyMoves)", () => {
  it("runs a swap inside one step", () => {
    expect(applyMoves(cluster, [move("a", 0, 1), move("b", 1, 0)])).toEqual([[1], [0], [2], [3]]);
  });

  it("runs a cycle of three inside one step", () => {
    expect(applyMoves(cluster, [move("a", 0, 1), move("b", 1, 2), move("c", 2, 0)])).toEqual([[1], [2], [0], [3]]);
  });

  it("runs a chain across steps: a host vacated in one step is free in the next", () => {
    const chain = [move("c", 3, 1, 1, 1), move("b", 1, 2, 0)];
    expect(() => applyMoves(cluster, [move("c", 3, 1, 0, 1)])).toThrow(PlanError);
    expect(() => applyMoves(cluster, chain)).toThrow(/receives two workers|busy/);
    const valid = [move("c", 2, 0, 0), move("a", 0, 2, 0), move("b", 1, 3, 1), move("c", 3, 1, 1, 1)];
    expect(applyMoves(cluster, valid)).toEqual([[2], [3], [0], [1]]);
  });

  it("rejects a destination that is busy and not vacated in its step", () => {
    expect(() => applyMoves(cluster, [move("a", 0, 1)])).toThrow(/step 0, move a\[0\] 0→1: the destination is busy/);
  });

  it("rejects a source that does not run the group", () => {
    expect(() => applyMoves(cluster, [move("a", 1, 0)])).toThrow(/the source does not run this group/);
    expect(() => applyMoves(cluster, [move("zz", 0, 1)])).toThrow(/no such job group/);
  });

  it("rejects two workers landing on one host", () => {
    const free = parseSnapshot({
      topology: { racks: 2, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 1 },
      jobs: [{ id: "a", hosts: [0, 1] }],
    });
    expect(() => applyMoves(free, [move("a", 0, 2), move("a", 1, 2)])).toThrow(/receives two workers/);
  });
});
