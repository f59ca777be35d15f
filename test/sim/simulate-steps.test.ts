import { describe, expect, it } from "vitest";
import { SimJobSchema, type SimJob } from "../../controller/simulator/jobs.ts";
import { SimConfigSchema, systemSpec, type SimConfigInput } from "../../controller/simulator/simulate.ts";
import { admitArrivals, advance, nextEventTime, settleRunning, startQueued } from "../../controller/simulator/simulate-events.ts";
import { refreshRates } from "../../controller/simulator/simulate-network.ts";
import { createSimState } from "../../controller/simulator/simulate-state.ts";
import { createTraceState, startJob, traceSummary, TraceOptionsSchema } from "../../controller/simulator/trace.ts";

/** 3 racks of 2 one-GPU hosts, one uplink each, links at 1 GB/s; hosts handed out left to right. */
const tiny: SimConfigInput = { fabric: { racks: 3, hostsPerRack: 2, gpusPerHost: 1, uplinksPerRack: 1, nicGbps: 8 }, scheduler: "fifo", lambda: 1 };

const job = (id: string, hosts: number, extra: Partial<SimJob> = {}): SimJob =>
  SimJobSchema.parse({ id, arrival: 0, hostsPerStage: hosts, iterations: 10, computeSeconds: 1, ringBytes: 1e9, ...extra });

const stateOf = (jobs: SimJob[], config: SimConfigInput = tiny) =>
  createSimState(jobs, SimConfigSchema.parse(config), "ecmp", systemSpec("ecmp"), undefined, {});

describe("simulateSystem's steps", () => {
  it("starts queued jobs in order until one does not fit (fifo), or every one that fits (backfill)", () => {
    // a takes hosts 0-1; big needs all six and waits; small fits beside a.
    const jobs = [job("a", 2), job("big", 6), job("small", 1)];
    const fifo = stateOf(jobs);
    admitArrivals(fifo);
    expect(startQueued(fifo)).toBe(true);
    expect([...fifo.running.keys()]).toEqual(["a"]);
    expect(fifo.queue.map((j) => j.id)).toEqual(["big", "small"]);
    expect(fifo.occupied).toEqual([true, true, false, false, false, false]);

    const backfill = stateOf(jobs, { ...tiny, queue: "backfill" });
    admitArrivals(backfill);
    expect(startQueued(backfill)).toBe(true);
    expect([...backfill.running.keys()]).toEqual(["a", "small"]);
    expect(backfill.queue.map((j) => j.id)).toEqual(["big"]);
    // Nothing more fits: nothing starts, and the routes stay as they are.
    backfill.routesDirty = false;
    expect(startQueued(backfill)).toBe(false);
    expect(backfill.routesDirty).toBe(false);
  });

  it("jumps the clock to a lone job's end and records its outcome there", () => {
    const state = stateOf([job("a", 2), job("later", 1, { arrival: 100 })]);
    admitArrivals(state);
    startQueued(state);
    refreshRates(state);
    // 1 s of compute and 1 GB at 1 GB/s per iteration, 10 iterations; the next arrival is later.
    expect(nextEventTime(state)).toBeCloseTo(20, 9);
    advance(state, nextEventTime(state));
    expect(state.running.get("a")!.progress).toBeCloseTo(10, 9);
    expect(settleRunning(state)).toBe(true);
    expect(state.running.size).toBe(0);
    expect(state.outcomes).toEqual([expect.objectContaining({ id: "a", start: 0, finish: state.now, moves: 0 })]);
    expect(state.outcomes[0]!.slowdown).toBeCloseTo(1, 9);
    expect(state.fragmentation.maxIntegral).toBe(0);
  });
});

describe("trace's steps", () => {
  const topology = { racks: 2, hostsPerRack: 2, gpusPerHost: 1, uplinksPerRack: 1 };
  const spec = { id: "j-0", rings: 2, stages: 1, hostsPerStage: 2 };

  it("turns away a job that breaks a bound during warm-up, and yields the cluster for one after", () => {
    const warming = createTraceState(TraceOptionsSchema.parse({ seed: 1, topology, mix: "dp", events: 1, warmup: 5 }));
    // Across both racks, two rings put each rack at 2 > λ = 1.
    expect(startJob(warming, spec, [[1, 2]])).toBeUndefined();
    expect(traceSummary(warming)).toMatchObject({ turnedAway: 1, events: 0 });
    expect(warming.occupied).toEqual([false, false, false, false]);
    // Inside one rack it breaks nothing: it starts, and there is nothing to yield.
    expect(startJob(warming, spec, [[0, 1]])).toBeUndefined();
    expect(warming.running.map((j) => j.groups)).toEqual([[[0, 1]]]);
    expect(warming.occupied).toEqual([true, true, false, false]);

    const measuring = createTraceState(TraceOptionsSchema.parse({ seed: 1, topology, mix: "dp", events: 1, warmup: 0 }));
    expect(startJob(measuring, spec, [[1, 2]])?.placement).toEqual([[1, 2]]);
    expect(traceSummary(measuring)).toMatchObject({ turnedAway: 0, events: 1 });
  });
});
