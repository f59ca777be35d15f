import { describe, expect, it } from "vitest";
import { parseSnapshot, SnapshotSchema, toSnapshot, violations, type Cluster, type Placement } from "../../controller/planner/model/index.ts";
import { trace, type TraceOptions, type TraceSummary } from "../../controller/simulator/trace.ts";

const dp16: TraceOptions = {
  seed: 11,
  topology: { racks: 16, hostsPerRack: 8, gpusPerHost: 8, uplinksPerRack: 2 },
  mix: "dp",
  events: 30,
};

/** Runs a trace to its end, answering every event with `reply`. */
function collect(options: TraceOptions, reply: (cluster: Cluster) => Placement | undefined = () => undefined) {
  const clusters: Cluster[] = [];
  const run = trace(options);
  let step = run.next();
  while (!step.done) {
    clusters.push(step.value);
    step = run.next(reply(step.value));
  }
  return { clusters, summary: step.value as TraceSummary };
}

/** Mirrors hosts inside their rack: a bijection that keeps every rack's fragmentation. */
const mirror = (cluster: Cluster): Placement => {
  const per = cluster.topology.hostsPerRack;
  return cluster.placement.map((hosts) => hosts.map((h) => h - (h % per) + (per - 1 - (h % per))));
};

describe("trace", () => {
  it("is deterministic: the same seed gives the same snapshots, another seed others", () => {
    const first = collect(dp16).clusters.map((c) => toSnapshot(c));
    expect(first).toHaveLength(30);
    expect(collect(dp16).clusters.map((c) => toSnapshot(c))).toEqual(first);
    expect(collect({ ...dp16, seed: 12 }).clusters.map((c) => toSnapshot(c))).not.toEqual(first);
  });

  it("yields snapshots that parse and round-trip through toSnapshot", () => {
    for (const options of [dp16, { ...dp16, mix: "tp8pp", topology: { ...dp16.topology, uplinksPerRack: 16 } } as const]) {
      for (const cluster of collect(options).clusters) {
        const snapshot = toSnapshot(cluster);
        expect(SnapshotSchema.safeParse(snapshot).success).toBe(true);
        expect(parseSnapshot(JSON.parse(JSON.stringify(snapshot)))).toEqual(cluster);
      }
    }
  });

  it("yields only when the newest job pushes a rack over its bound", () => {
    const { clusters } = collect({ ...dp16, events: 40 });
    for (const cluster of clusters) {
      const over = violations(cluster).racks;
      expect(over.length).toBeGreaterThan(0);
      const newest = cluster.placement.at(-1) ?? [];
      const racksOfNewest = new Set(newest.map((h) => Math.floor(h / cluster.topology.hostsPerRack)));
      expect(racksOfNewest.size).toBeGreaterThan(1);
      expect(over.some((rack) => racksOfNewest.has(rack))).toBe(true);
    }
  });

  it("places arrivals by the front-end it is given", () => {
    const racksPerGroup = (clusters: Cluster[]) => {
      const spans = clusters.flatMap((c) => c.placement.map((hosts) => new Set(hosts.map((h) => Math.floor(h / 8))).size));
      return spans.reduce((a, b) => a + b, 0) / spans.length;
    };
    const options = { ...dp16, events: 5 };
    expect(collect({ ...options, scheduler: "random" }).clusters.map((c) => toSnapshot(c))).toEqual(
      collect({ ...options, scheduler: "random" }).clusters.map((c) => toSnapshot(c)),
    );
    // Best-fit keeps a job in one rack where it can; drawn at random, hosts lie scattered.
    expect(racksPerGroup(collect({ ...options, scheduler: "random" }).clusters)).toBeGreaterThan(racksPerGroup(collect(options).clusters));
  });

  it("builds TP jobs with one group per stage and 8 rings", () => {
    const { clusters } = collect({ ...dp16, mix: "tp8pp", topology: { ...dp16.topology, uplinksPerRack: 16 }, events: 10 });
    const groups = clusters.flatMap((c) => c.groups.filter((g) => g.rings === 8));
    expect(groups.length).toBeGreaterThan(0);
    expect(groups.some((g) => g.index > 0)).toBe(true);
    for (const cluster of clusters) expect(violations(cluster).racks.length).toBeGreaterThan(0);
  });

  it("yields on pod violations when podLambda is set", () => {
    const { clusters } = collect({
      ...dp16,
      topology: { ...dp16.topology, racksPerPod: 4 },
      lambda: 100,
      podLambda: 2,
      events: 10,
    });
    expect(clusters).toHaveLength(10);
    for (const cluster of clusters) {
      expect(cluster.podLambda).toBe(2);
      expect(violations(cluster)).toMatchObject({ racks: [], pods: expect.arrayContaining([expect.any(Number)]) });
    }
  });

  it("continues from the placement it is given", () => {
    const run = trace(dp16);
    let step = run.next();
    let carried = 0;
    for (let event = 0; event < 10 && !step.done; event++) {
      const given = mirror(step.value);
      const hostsByJob = new Map(step.value.groups.map((g, i) => [`${g.job}/${g.index}`, given[i]]));
      step = run.next(given);
      if (step.done) break;
      const next = step.value;
      next.groups.forEach((g, i) => {
        const before = hostsByJob.get(`${g.job}/${g.index}`);
        if (before === undefined) return;
        carried++;
        expect(next.placement[i]).toEqual(before);
      });
    }
    expect(carried).toBeGreaterThan(20);
  });

  it("rejects a reply that is not a placement of the same groups", () => {
    const broken: [(c: Cluster) => Placement, RegExp][] = [
      [(c) => c.placement.map((hosts, g) => (g === 1 ? (c.placement[0] ?? []) : hosts)), /^placement at .*already used/],
      [(c) => c.placement.map((hosts, g) => (g === 0 ? [...hosts, ...hosts.map((h) => h + 1000)] : hosts)), /^placement at .*out of range/],
      [
        (c) => c.placement.map((hosts, g) => (g === 0 ? hosts.slice(0, 1) : g === 1 ? [...hosts, ...(c.placement[0] ?? []).slice(1)] : hosts)),
        /^placement at \[0\]: expected \d+ hosts/,
      ],
      [(c) => c.placement.slice(1), /^placement: expected \d+ groups/],
    ];
    const run = trace(dp16);
    const first = run.next();
    if (first.done) throw new Error("the trace yielded nothing");
    const cluster = first.value;
    expect(cluster.placement[0]?.length).toBeGreaterThan(1);
    for (const [reply, message] of broken) {
      const again = trace(dp16);
      again.next();
      expect(() => again.next(reply(cluster))).toThrow(message);
    }
  });

  it("runs the cluster at its target load", () => {
    for (const load of [0.6, 0.9]) {
      const { summary } = collect({ ...dp16, lambda: 1000, load, events: 1, maxArrivals: 15_000 });
      expect(summary.events).toBe(0);
      expect(summary.arrivals).toBe(15_000);
      expect(summary.load).toBeGreaterThan(load - 0.04);
      expect(summary.load).toBeLessThan(load + 0.04);
    }
  });

  it("turns away warm-up jobs that would break a bound instead of yielding them", () => {
    const { summary } = collect({ ...dp16, warmup: 2000, events: 5 });
    expect(summary.turnedAway).toBeGreaterThan(0);
    expect(summary.arrivals).toBeGreaterThan(2000);
    expect(summary.events).toBe(5);
  });

  it("rejects options it cannot simulate", () => {
    expect(() => trace({ ...dp16, load: 1.5 }).next()).toThrow(/load/);
    expect(() => trace({ ...dp16, podLambda: 2 }).next()).toThrow(/racksPerPod/);
  });
});
