import { describe, expect, it } from "vitest";
import { parseSnapshot, toSnapshot } from "../../controller/planner/model/index.ts";
import { constrain } from "../../controller/simulator/index.ts";

/** 64 hosts, 40 jobs of one host each on the first 40: 24 free. */
const cluster = parseSnapshot({
  topology: { racks: 8, hostsPerRack: 8, gpusPerHost: 8, uplinksPerRack: 2 },
  lambda: 2,
  jobs: Array.from({ length: 40 }, (_, j) => ({ id: `job-${j}`, rings: 1, hosts: [j] })),
});

describe("constrain", () => {
  it("pins about the share of jobs asked and holds back only free hosts", () => {
    const held = constrain(cluster, { pinned: 0.5, unavailable: 0.5, seed: 1 });
    const jobs = toSnapshot(held).jobs;
    const pinned = jobs.filter((j) => j.movable === false).length;
    expect(pinned).toBeGreaterThan(jobs.length * 0.25);
    expect(pinned).toBeLessThan(jobs.length * 0.75);
    const used = new Set(cluster.placement.flat());
    expect(held.unavailable.length).toBeGreaterThan(0);
    for (const h of held.unavailable) expect(used.has(h)).toBe(false);
    expect(held.placement).toEqual(cluster.placement);
  });

  it("is deterministic in its seed, and leaves the cluster alone at zero", () => {
    expect(toSnapshot(constrain(cluster, { pinned: 0.3, unavailable: 0.3, seed: 7 }))).toEqual(
      toSnapshot(constrain(cluster, { pinned: 0.3, unavailable: 0.3, seed: 7 })),
    );
    expect(toSnapshot(constrain(cluster, { pinned: 0, unavailable: 0, seed: 7 }))).toEqual(toSnapshot(cluster));
  });
});
