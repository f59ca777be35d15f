import { describe, expect, it } from "vitest";
import { InvalidInputError, parseSnapshot, parseSnapshotText, toSnapshot } from "../../controller/planner/model/index.ts";
import { MAX_GPUS_PER_HOST, MAX_HOSTS, MAX_HOSTS_PER_RACK, MAX_RACKS, MAX_UPLINKS_PER_RACK } from "../../sdk/contract/protocol/limits.ts";

const topology = { racks: 2, hostsPerRack: 4, gpusPerHost: 8, uplinksPerRack: 2 };

function errorOf(value: unknown): string {
  try {
    parseSnapshot(value, "snapshot s.json");
  } catch (error) {
    expect(error).toBeInstanceOf(InvalidInputError);
    return (error as Error).message;
  }
  throw new Error("expected the snapshot to be rejected");
}

describe("snapshot schema", () => {
  it("accepts the design page's example and applies defaults", () => {
    const cluster = parseSnapshot({
      topology: { racks: 16, hostsPerRack: 8, gpusPerHost: 8, uplinksPerRack: 16, racksPerPod: 4 },
      lambda: 16,
      jobs: [
        { id: "a", rings: 1, hosts: [0, 1, 9] },
        {
          id: "b",
          rings: 8,
          groups: [
            [2, 3],
            [10, 11],
          ],
        },
      ],
    });
    expect(cluster.groups).toEqual([
      { job: "a", index: 0, rings: 1, movable: true },
      { job: "b", index: 0, rings: 8, movable: true },
      { job: "b", index: 1, rings: 8, movable: true },
    ]);
    expect(cluster.unavailable).toEqual([]);
    expect(cluster.placement).toEqual([
      [0, 1, 9],
      [2, 3],
      [10, 11],
    ]);
    expect(cluster.podCount).toBe(4);
    expect(parseSnapshot({ topology, jobs: [{ id: "x", hosts: [0] }] }).lambda).toBe(2);
    expect(parseSnapshot({ topology, jobs: [{ id: "x", hosts: [0] }] }).groups[0]?.rings).toBe(1);
  });

  it("round-trips through toSnapshot", () => {
    const doc = {
      topology,
      lambda: 1,
      jobs: [
        { id: "a", rings: 2, groups: [[0, 4], [1]] },
        { id: "b", rings: 1, hosts: [5, 6] },
      ],
    };
    expect(toSnapshot(parseSnapshot(doc))).toEqual(doc);
    const pinned = { ...doc, jobs: [{ ...doc.jobs[0]!, movable: false }, doc.jobs[1]!], unavailable: [2, 7] };
    expect(toSnapshot(parseSnapshot(pinned))).toEqual(pinned);
  });

  it("reads pinned jobs and unavailable hosts", () => {
    const cluster = parseSnapshot({
      topology,
      unavailable: [7, 3],
      jobs: [
        { id: "a", hosts: [0, 4], movable: false },
        { id: "b", hosts: [1], movable: true },
      ],
    });
    expect(cluster.groups.map((g) => g.movable)).toEqual([false, true]);
    expect(cluster.unavailable).toEqual([3, 7]);
  });

  it.each([
    [{ topology, jobs: [], extra: 1 }, 'snapshot s.json: unknown field "extra"; remove it or check its spelling'],
    [{ topology: { ...topology, spines: 4 }, jobs: [] }, 'snapshot s.json at topology: unknown field "spines"'],
    [
      { topology, jobs: [{ id: "a", hosts: [0, 8] }] },
      "snapshot s.json at jobs[0].hosts[1]: host 8 is out of range: the topology has hosts 0..7 (2 racks × 4 hosts)",
    ],
    [
      {
        topology,
        jobs: [
          { id: "a", hosts: [0] },
          { id: "b", groups: [[1], [0]] },
        ],
      },
      'snapshot s.json at jobs[1].groups[1][0]: host 0 is already used by job "a"',
    ],
    [{ topology, jobs: [{ id: "a", hosts: [-1] }] }, "snapshot s.json at jobs[0].hosts[0]: host indices start at 0"],
    [{ topology, lambda: -1, jobs: [] }, "snapshot s.json at lambda: lambda must not be negative"],
    [{ topology: { ...topology, racks: 0 }, jobs: [] }, "snapshot s.json at topology.racks: racks must be at least 1"],
    [{ topology, jobs: [{ id: "a", rings: 1.5, hosts: [0] }] }, "snapshot s.json at jobs[0].rings: rings must be a whole number"],
    [{ topology, jobs: [{ id: "a" }] }, "snapshot s.json at jobs[0]: a job lists either `hosts`"],
    [
      {
        topology,
        jobs: [
          { id: "a", hosts: [0] },
          { id: "a", hosts: [1] },
        ],
      },
      'snapshot s.json at jobs[1].id: job id "a" is used twice',
    ],
    [{ topology, podLambda: 2, jobs: [] }, "snapshot s.json at podLambda: podLambda needs topology.racksPerPod"],
    [{ topology: { ...topology, racksPerPod: 3 }, jobs: [] }, "snapshot s.json at topology.racksPerPod: racksPerPod (3) must divide racks (2)"],
    [{ jobs: [] }, "snapshot s.json at topology:"],
    [
      { topology, unavailable: [3, 8], jobs: [] },
      "snapshot s.json at unavailable[1]: host 8 is out of range: the topology has hosts 0..7 (2 racks × 4 hosts); list only hosts of the topology",
    ],
    [{ topology, unavailable: [3, 3], jobs: [] }, "snapshot s.json at unavailable[1]: host 3 is listed twice; list each unavailable host once"],
    [{ topology, unavailable: 3, jobs: [] }, "snapshot s.json at unavailable:"],
    [{ topology, jobs: [{ id: "a", hosts: [0], movable: "no" }] }, "snapshot s.json at jobs[0].movable: movable must be true or false"],
  ])("rejects %j with one line naming the place", (value, expected) => {
    const message = errorOf(value);
    expect(message).toContain(expected);
    expect(message).not.toContain("\n");
  });

  it("reports how many more problems there are", () => {
    expect(errorOf({ topology, jobs: [{ id: "a", hosts: [9, 10] }] })).toMatch(/\(and 1 more\)$/);
  });

  it("rejects text that is not JSON", () => {
    expect(() => parseSnapshotText("{ topology: ", "snapshot s.json")).toThrow(/^snapshot s\.json: not valid JSON/);
  });
});

describe("snapshot limits: huge or adversarial sizes are refused before any work", () => {
  it.each([
    [{ ...topology, racks: 1e7 }, `at topology.racks: racks must be at most ${MAX_RACKS}, the largest MonkeyTree supports`],
    [{ ...topology, hostsPerRack: 1e7 }, `at topology.hostsPerRack: hostsPerRack must be at most ${MAX_HOSTS_PER_RACK}, the largest MonkeyTree supports`],
    [
      { ...topology, uplinksPerRack: 1e7 },
      `at topology.uplinksPerRack: uplinksPerRack must be at most ${MAX_UPLINKS_PER_RACK}, the largest MonkeyTree supports`,
    ],
    [
      { ...topology, racks: MAX_RACKS, hostsPerRack: MAX_HOSTS_PER_RACK },
      `at topology.hostsPerRack: racks × hostsPerRack (${MAX_RACKS} × ${MAX_HOSTS_PER_RACK}) must be at most ${MAX_HOSTS} hosts, the largest MonkeyTree supports`,
    ],
  ])("names the field and the limit for a topology beyond it", (huge, message) => {
    expect(errorOf({ topology: huge, jobs: [] })).toBe(`snapshot s.json ${message}`);
  });

  it("bounds rings, lambda and job ids", () => {
    expect(errorOf({ topology, jobs: [{ id: "a", rings: 1e9, hosts: [0] }] })).toBe(
      `snapshot s.json at jobs[0].rings: rings must be at most ${MAX_GPUS_PER_HOST}, the largest MonkeyTree supports`,
    );
    expect(errorOf({ topology, lambda: 1e12, jobs: [] })).toContain(`at lambda: lambda must be at most ${MAX_HOSTS * MAX_GPUS_PER_HOST}`);
    expect(errorOf({ topology, jobs: [{ id: "a\u001b[2J", hosts: [0] }] })).toBe(
      "snapshot s.json at jobs[0].id: a job id may hold only letters, digits and . _ : @ + = / -",
    );
  });

  it("measures lists before validating their elements, so millions of bad hosts cost one issue", () => {
    const hosts = new Array<number>(3_000_000).fill(-1);
    const started = performance.now();
    expect(errorOf({ topology, jobs: [{ id: "a", hosts }] })).toBe(
      `snapshot s.json at jobs[0]: 3000000 host entries up to this job; a snapshot holds at most ${MAX_HOSTS}, one per host of the largest cluster MonkeyTree supports`,
    );
    expect(errorOf({ topology, jobs: new Array(MAX_HOSTS + 1).fill(0) })).toContain(`at jobs: ${MAX_HOSTS + 1} jobs; a snapshot holds at most ${MAX_HOSTS}`);
    expect(errorOf({ topology, jobs: [], unavailable: hosts })).toContain(`at unavailable: 3000000 unavailable hosts; a snapshot holds at most ${MAX_HOSTS}`);
    expect(performance.now() - started).toBeLessThan(1_000);
  });
});
