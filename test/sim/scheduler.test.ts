import { describe, expect, it } from "vitest";
import { Random } from "../../controller/simulator/random.ts";
import { bestFit, firstFree, randomFree, scheduler } from "../../controller/simulator/scheduler.ts";

/** Occupancy of racks of `hostsPerRack` hosts, given the busy hosts' indices. */
function occupancy(racks: number, hostsPerRack: number, busy: number[]): boolean[] {
  const occupied = new Array<boolean>(racks * hostsPerRack).fill(false);
  for (const h of busy) occupied[h] = true;
  return occupied;
}

describe("bestFit", () => {
  // 4 racks of 4 hosts. Free: rack 0 has 4, rack 1 has 2 (5, 7), rack 2 has 3 (8, 10, 11), rack 3 has 1 (15).
  const occupied = occupancy(4, 4, [4, 6, 9, 12, 13, 14]);

  it("puts a job that fits in one rack on the fullest rack that fits, lowest hosts first", () => {
    expect(bestFit(occupied, 4, [1])).toEqual([[15]]);
    expect(bestFit(occupied, 4, [2])).toEqual([[5, 7]]);
    expect(bestFit(occupied, 4, [3])).toEqual([[8, 10, 11]]);
    expect(bestFit(occupied, 4, [4])).toEqual([[0, 1, 2, 3]]);
  });

  it("breaks ties between equally full racks by the lowest rack", () => {
    const even = occupancy(3, 4, [0, 4, 8]);
    expect(bestFit(even, 4, [2])).toEqual([[1, 2]]);
  });

  it("splits a job that fits nowhere over the emptiest racks, emptiest first, as the artifact does", () => {
    // 6 hosts: rack 0 gives 4, then rack 2 (3 free, the most left) the other 2, though they
    // would fill rack 1 exactly.
    expect(bestFit(occupied, 4, [6])).toEqual([[0, 1, 2, 3, 8, 10]]);
    // 8 hosts: rack 0 (4), rack 2 (3), then rack 1 (2 free, more than rack 3's 1).
    expect(bestFit(occupied, 4, [8])).toEqual([[0, 1, 2, 3, 8, 10, 11, 5]]);
  });

  it("hands hosts to pipeline stages in stage order", () => {
    expect(bestFit(occupied, 4, [3, 3])).toEqual([
      [0, 1, 2],
      [3, 8, 10],
    ]);
  });

  it("returns undefined when the cluster has too few free hosts, leaving the input alone", () => {
    const before = [...occupied];
    expect(bestFit(occupied, 4, [5, 6])).toBeUndefined();
    expect(bestFit(occupied, 4, [10])).toEqual([[0, 1, 2, 3, 8, 10, 11, 5, 7, 15]]);
    expect(occupied).toEqual(before);
  });
});

describe("firstFree and randomFree", () => {
  const occupied = occupancy(3, 4, [0, 2, 5, 9]);
  const free = [1, 3, 4, 6, 7, 8, 10, 11];

  it("FIFO takes the lowest free hosts, left to right across racks, stage by stage", () => {
    expect(firstFree(occupied, 4, [3])).toEqual([[1, 3, 4]]);
    expect(firstFree(occupied, 4, [2, 2])).toEqual([
      [1, 3],
      [4, 6],
    ]);
    expect(firstFree(occupied, 4, [9])).toBeUndefined();
  });

  it("Random takes distinct free hosts, the same ones for the same seed", () => {
    const draw = (seed: number) => randomFree(new Random(seed))(occupied, 4, [3, 2]);
    const groups = draw(1)!;
    const hosts = groups.flat();
    expect(groups.map((g) => g.length)).toEqual([3, 2]);
    expect(new Set(hosts).size).toBe(5);
    for (const h of hosts) expect(free).toContain(h);
    expect(draw(1)).toEqual(groups);
    const seeds = Array.from({ length: 20 }, (_, s) => JSON.stringify(draw(s)));
    expect(new Set(seeds).size).toBeGreaterThan(10);
    expect(randomFree(new Random(1))(occupied, 4, [9])).toBeUndefined();
  });

  it("is chosen by name", () => {
    expect(scheduler("best-fit", new Random(1))).toBe(bestFit);
    expect(scheduler("fifo", new Random(1))).toBe(firstFree);
  });
});
