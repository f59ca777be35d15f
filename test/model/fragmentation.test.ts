import { describe, expect, it } from "vitest";
import { parseSnapshot, podFragmentation, rackFragmentation, violations, withinBounds } from "../../controller/planner/model/index.ts";

describe("fragmentation degree", () => {
  const cluster = parseSnapshot({
    topology: { racks: 4, hostsPerRack: 4, gpusPerHost: 8, uplinksPerRack: 2, racksPerPod: 2 },
    lambda: 1,
    podLambda: 8,
    jobs: [
      { id: "whole", hosts: [0, 1] },
      { id: "split", hosts: [2, 4, 5] },
      {
        id: "tp",
        rings: 8,
        groups: [
          [3, 12],
          [6, 7],
        ],
      },
    ],
  });

  it("counts rings of groups that span racks, per rack", () => {
    // rack 0: split (1) + tp stage 0 (8); rack 1: split (1), tp stage 1 is whole on rack 1;
    // rack 3: tp stage 0 (8).
    expect(rackFragmentation(cluster)).toEqual([9, 1, 0, 8]);
  });

  it("counts pods the same way", () => {
    // split spans racks 0 and 1, both in pod 0; tp stage 0 spans pods 0 and 1.
    expect(podFragmentation(cluster)).toEqual([8, 8]);
  });

  it("lists racks and pods over their bounds", () => {
    expect(violations(cluster)).toEqual({ racks: [0, 3], pods: [] });
    expect(withinBounds(cluster)).toBe(false);
    expect(
      withinBounds(cluster, [
        [0, 1],
        [4, 5, 6],
        [3, 2],
        [12, 7],
      ]),
    ).toBe(false);
    expect(
      withinBounds(cluster, [
        [0, 1],
        [4, 5, 6],
        [2, 3],
        [8, 9],
      ]),
    ).toBe(true);
  });
});
