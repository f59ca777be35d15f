// Two tails of `npm run bench:plan`: the anytime schedule on a hard event at several time
// limits, and what answering "unchanged" costs on within-bounds snapshots as they grow.
import { readFileSync } from "node:fs";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { table } from "../cli/io.ts";
import { clusterFromSnapshot, parseSnapshotText, rackFragmentation, type Cluster } from "../controller/planner/model/index.ts";
import { CountState } from "../controller/planner/plan/counts.ts";
import { PlanTimeoutError, type Planner } from "../controller/planner/plan/index.ts";
import { syntheticSnapshot } from "../controller/simulator/synthetic.ts";

/** A rare hard event (optimum 8 moves) shipped with the design notes. */
const HARD_EXAMPLE = new URL("../cli/snapshots/hard-2048gpu-lambda2.json", import.meta.url);

/**
 * Plans the hard example once per limit, longest first: the longest limit's time to its
 * proof is what every limit at least that long must match.
 */
export function anytimeTable(planner: Planner, limitsSec: readonly number[]): string {
  const cluster = parseSnapshotText(readFileSync(HARD_EXAMPLE, "utf8"), "hard-2048gpu-lambda2.json");
  const rows = [...limitsSec]
    .sort((a, b) => b - a)
    .map((limit) => {
      const started = performance.now();
      try {
        const plan = planner.plan(cluster, { timeLimitMs: limit * 1000 });
        return [limit, plan.status, plan.moveCount, plan.lowerBound, plan.method, (plan.solveMs / 1000).toFixed(2)];
      } catch (error) {
        if (!(error instanceof PlanTimeoutError)) throw error;
        return [limit, "no plan", "-", error.lowerBound, "-", ((performance.now() - started) / 1000).toFixed(2)];
      }
    });
  return [
    "hard event (cli/snapshots/hard-2048gpu-lambda2.json, 2,048 GPUs, λ = 2, optimum 8 moves) at several time limits",
    table(["limit s", "status", "moves", "lower bound", "method", "seconds"], rows),
  ].join("\n");
}

const gc = (() => {
  setFlagsFromString("--expose-gc");
  return runInNewContext("gc") as () => void;
})();

/** JavaScript heap and typed arrays' buffers, which live outside it. */
const used = () => {
  const { heapUsed, arrayBuffers } = process.memoryUsage();
  return heapUsed + arrayBuffers;
};

/** Memory growth over `work` (from a collected heap; V8 may still collect during it) and its time. */
function measure<T>(work: () => T): { ms: number; mb: number; value: T } {
  gc();
  const before = used();
  const started = performance.now();
  const value = work();
  const ms = performance.now() - started;
  return { ms, mb: Math.max(0, used() - before) / 2 ** 20, value };
}

/**
 * Within-bounds snapshots of growing size (past the supported limits, built without
 * validation), answered by the planner, beside one pass of rack fragmentation (the linear
 * baseline) and the per (group, rack) counts the planner builds when it must search.
 */
export function unchangedTable(planner: Planner, racksList: readonly number[]): string {
  const rows = racksList.map((racks) => {
    const cluster: Cluster = clusterFromSnapshot(syntheticSnapshot({ racks, hostsPerRack: 8, uplinksPerRack: 8, rings: 1, maxSpan: 2 }, racks));
    const plan = measure(() => planner.plan(cluster));
    // After the plan, which makes the same pass among others, so both run compiled code.
    const baseline = measure(() => rackFragmentation(cluster));
    if (plan.value.status !== "unchanged") throw new Error(`internal: a synthetic snapshot of ${racks} racks is over its bound`);
    const counts = measure(() => new CountState(cluster));
    return [
      (racks * 8).toLocaleString("en-US"),
      cluster.groups.length.toLocaleString("en-US"),
      plan.ms.toFixed(1),
      plan.mb.toFixed(1),
      baseline.ms.toFixed(1),
      `${(plan.ms / baseline.ms).toFixed(1)}×`,
      counts.ms.toFixed(1),
      counts.mb.toFixed(1),
    ];
  });
  return [
    "within-bounds snapshots answered unchanged (8 hosts per rack, synthetic; sizes past 2,048 hosts unvalidated)",
    table(["hosts", "groups", "plan ms", "plan MB", "one fragmentation pass ms", "plan/pass", "per (group, rack) counts ms", "counts MB"], rows),
  ].join("\n");
}
