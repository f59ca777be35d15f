import { parseSnapshot, toSnapshot, type Cluster } from "../planner/model/cluster.ts";
import { Random } from "./random.ts";

/** What an operator's cluster holds back from the planner, as fractions drawn at random. */
export interface Constraints {
  /** Share of jobs pinned (`movable: false`): not opted in, or not migratable. */
  readonly pinned: number;
  /** Share of the free hosts unavailable: drained, failed or reserved. */
  readonly unavailable: number;
  readonly seed: number;
}

/**
 * The same cluster with some jobs pinned and some free hosts unavailable: the events a
 * generated trace yields, made as hard as a real cluster's. Deterministic in `seed`.
 */
export function constrain(cluster: Cluster, { pinned, unavailable, seed }: Constraints): Cluster {
  const random = new Random(seed);
  const used = new Set(cluster.placement.flat());
  const snapshot = toSnapshot(cluster);
  const held = Array.from({ length: cluster.hostCount }, (_, h) => h).filter((h) => !used.has(h) && random.float() < unavailable);
  return parseSnapshot(
    { ...snapshot, jobs: snapshot.jobs.map((job) => (random.float() < pinned ? { ...job, movable: false } : job)), unavailable: held },
    "constrained snapshot",
  );
}
