import { z } from "zod";
import { clusterFromSnapshot, type Cluster } from "../planner/model/cluster.ts";
import { TopologySchema, type Job, type Topology } from "../planner/model/snapshot.ts";
import { ringOrder } from "../planner/route/ring-order.ts";
import { MoveSchema } from "../planner/plan/schema.ts";
import { ReplacementNameSchema } from "../../sdk/contract/protocol/replacement.ts";
import { ParallelismSchema } from "../../sdk/contract/protocol/worker.ts";
import { isCommitted, MigrationSchema, planned, type Migration } from "./migration.ts";

/**
 * The controller's durable state and the one reducer that changes it. The live controller
 * journals a record, then applies it with `applyRecord`; replay applies the same records in
 * the same order, so a restarted controller holds exactly what the old one had journaled.
 * Who is connected (workers' sockets, held barriers, daemons' heartbeats) is not durable: it
 * comes back as launchers and daemons talk to the new controller.
 */

const count = z.int().min(0);

const Header = { seq: count, at: z.number() };

const JobStateSchema = z
  .strictObject({
    id: z.string(),
    rings: z.int().min(1),
    parallelism: ParallelismSchema,
    /** Hosts of each group (pipeline stage), in ring order. */
    groups: z.array(z.array(count).readonly()).readonly(),
    checkpointBytes: z.record(z.string(), count).readonly(),
    /** The destination daemons' --replacement that starts its replacements; null when it named none. */
    replacement: ReplacementNameSchema.nullable(),
    /** Bumped whenever membership or order changes, so workers can tell assignments apart. */
    generation: count,
    /** The barrier step the job last stopped at for a reconfiguration. */
    resumeStep: count.nullable(),
    /** The cluster's scheduler was seen running the job: once it no longer does, the job ended. */
    scheduled: z.boolean().default(false),
    /**
     * The hosts its committed moves brought it to, and it still runs on: under a scheduler, the
     * only hosts outside its allocation that MonkeyTree holds for it.
     */
    movedTo: z.array(count).readonly().default([]),
  })
  .readonly();
export type JobState = z.infer<typeof JobStateSchema>;

/** The durable state beyond the config, as a compacted journal's second record holds it. */
const SnapshotSchema = z.strictObject({
  jobs: z.array(JobStateSchema),
  finished: z.array(z.string()),
  migrations: z.array(MigrationSchema),
  activePlan: z.string().nullable(),
  activeMoves: z.array(z.string()),
  plans: count,
});

export const RecordSchema = z.discriminatedUnion("kind", [
  /** First record of every journal: what the cluster is. */
  z.strictObject({ ...Header, kind: z.literal("config"), topology: TopologySchema, lambda: count, podLambda: count.nullable() }),
  /** Every worker of the job registered; `groups` are in ring order. */
  z.strictObject({
    ...Header,
    kind: z.literal("job-started"),
    job: z.string(),
    rings: z.int().min(1),
    parallelism: ParallelismSchema,
    groups: z.array(z.array(count)),
    /** Checkpoint size of the worker on each host, keyed by host. */
    checkpointBytes: z.record(z.string(), count),
    /** Which daemon --replacement starts its workers' replacements (`worker.register`'s `replacement`). */
    replacement: ReplacementNameSchema.nullable().default(null),
  }),
  z.strictObject({ ...Header, kind: z.literal("job-finished"), job: z.string() }),
  /**
   * The cluster's scheduler runs this started job. Journaled so that a job that ends while
   * the controller is down is still seen to end by the next one.
   */
  z.strictObject({ ...Header, kind: z.literal("job-scheduled"), job: z.string() }),
  /** A plan's moves; each becomes a `planned` migration with id `plan/index`. */
  z.strictObject({ ...Header, kind: z.literal("plan"), plan: z.string(), moves: z.array(MoveSchema) }),
  /** A migration entered a new state. */
  z.strictObject({ ...Header, kind: z.literal("migration"), migration: MigrationSchema }),
  /** Everything the records before it built, written by compaction right after `config`. */
  z.strictObject({ ...Header, kind: z.literal("snapshot"), state: SnapshotSchema }),
]);
export type JournalRecord = z.infer<typeof RecordSchema>;
/** A record before the journal gives it its sequence number and time. */
export type RecordBody = JournalRecord extends infer R ? (R extends JournalRecord ? Omit<R, "seq" | "at"> : never) : never;

export interface DurableState {
  readonly topology: Topology;
  readonly lambda: number;
  readonly podLambda: number | null;
  readonly jobs: ReadonlyMap<string, JobState>;
  /**
   * The latest finished jobs, oldest first, so a `job.finish` resent after a lost reply (or
   * across a restart) is answered again instead of refused; bounded by `FINISHED_KEPT`.
   */
  readonly finished: readonly string[];
  readonly migrations: ReadonlyMap<string, Migration>;
  /** The plan being carried out, if any, and its migrations' ids. */
  readonly activePlan: string | null;
  readonly activeMoves: readonly string[];
  readonly plans: number;
  readonly records: number;
}

export const FINISHED_KEPT = 1024;

/**
 * What a compacted journal keeps: the jobs, the recent finishes, and the migrations still
 * worth remembering — the active plan's, and those of running jobs (a committed move tells
 * its old source to stop).
 */
export function snapshotOf(state: DurableState): Extract<RecordBody, { kind: "snapshot" }> {
  const active = new Set(state.activeMoves);
  return {
    kind: "snapshot",
    state: {
      jobs: [...state.jobs.values()],
      finished: [...state.finished],
      migrations: [...state.migrations.values()].filter((m) => active.has(m.id) || state.jobs.has(m.job)),
      activePlan: state.activePlan,
      activeMoves: [...state.activeMoves],
      plans: state.plans,
    },
  };
}

export function initialState(config: Extract<RecordBody, { kind: "config" }>): DurableState {
  return {
    topology: config.topology,
    lambda: config.lambda,
    podLambda: config.podLambda,
    jobs: new Map(),
    finished: [],
    migrations: new Map(),
    activePlan: null,
    activeMoves: [],
    plans: 0,
    records: 1,
  };
}

/** Raised when a record does not fit the state it is applied to; a journal with one is corrupt. */
export class StateError extends Error {
  override readonly name = "StateError";
  readonly code = "invalid_record";
}

export function applyRecord(state: DurableState, record: JournalRecord): DurableState {
  const next = { ...state, records: state.records + 1 };
  switch (record.kind) {
    case "config":
      throw new StateError("a second config record; a journal has exactly one, first");
    case "snapshot": {
      if (state.records !== 1) throw new StateError("a snapshot record after others; compaction writes it right after the config");
      const { jobs, finished, migrations, activePlan, activeMoves, plans } = record.state;
      return {
        ...next,
        jobs: new Map(jobs.map((job) => [job.id, job])),
        finished,
        migrations: new Map(migrations.map((m) => [m.id, m])),
        activePlan,
        activeMoves,
        plans,
      };
    }
    case "job-started": {
      if (state.jobs.has(record.job)) throw new StateError(`job "${record.job}" started twice`);
      const jobs = new Map(state.jobs);
      jobs.set(record.job, {
        id: record.job,
        rings: record.rings,
        parallelism: record.parallelism,
        groups: record.groups,
        checkpointBytes: record.checkpointBytes,
        replacement: record.replacement,
        generation: 0,
        resumeStep: null,
        scheduled: false,
        movedTo: [],
      });
      return { ...next, jobs };
    }
    case "job-scheduled": {
      const job = state.jobs.get(record.job);
      if (!job) throw new StateError(`job "${record.job}" was scheduled but never started`);
      const jobs = new Map(state.jobs);
      jobs.set(record.job, { ...job, scheduled: true });
      return { ...next, jobs };
    }
    case "job-finished": {
      const jobs = new Map(state.jobs);
      jobs.delete(record.job);
      const finished = [...state.finished.filter((id) => id !== record.job), record.job].slice(-FINISHED_KEPT);
      return { ...next, jobs, finished };
    }
    case "plan": {
      // The previous plan's moves stay for a while (its replaced workers may still call in);
      // older ones are finished and forgotten, so the state does not grow with every plan.
      const migrations = new Map(
        state.activeMoves.flatMap((id) => {
          const m = state.migrations.get(id);
          return m ? [[id, m] as const] : [];
        }),
      );
      const ids = record.moves.map((_, i) => `${record.plan}/${i}`);
      record.moves.forEach((move, i) => {
        const id = ids[i] ?? "";
        const bytes = state.jobs.get(move.job)?.checkpointBytes[String(move.from)] ?? 0;
        migrations.set(id, planned({ id, job: move.job, group: move.group, from: move.from, to: move.to, planStep: move.step, bytes }, record.at));
      });
      return { ...next, migrations, activePlan: record.moves.length ? record.plan : null, activeMoves: ids, plans: state.plans + 1 };
    }
    case "migration": {
      const m = record.migration;
      const before = state.migrations.get(m.id);
      if (!before) throw new StateError(`migration ${m.id} was never planned`);
      const migrations = new Map(state.migrations);
      migrations.set(m.id, m);
      const jobs = !isCommitted(before.state) && isCommitted(m.state) ? commitMove(state, m) : state.jobs;
      return { ...next, migrations, jobs };
    }
  }
}

/** Moves the worker to its destination, keeping the group's surviving ring order. */
export function commitMove(state: DurableState, m: Migration): Map<string, JobState> {
  const job = state.jobs.get(m.job);
  const jobs = new Map(state.jobs);
  if (!job) return jobs;
  const cluster = topologyCluster(state);
  const groups = job.groups.map((hosts, g) => {
    if (g !== m.group) return hosts;
    const moved = hosts.map((h) => (h === m.from ? m.to : h));
    return ringOrder(
      cluster,
      moved,
      hosts.map((h) => (h === m.from ? m.to : h)),
    );
  });
  const checkpointBytes = { ...job.checkpointBytes, [String(m.to)]: job.checkpointBytes[String(m.from)] ?? m.bytes };
  delete checkpointBytes[String(m.from)];
  const movedTo = [...job.movedTo.filter((h) => h !== m.from && h !== m.to), m.to];
  jobs.set(m.job, { ...job, groups, checkpointBytes, movedTo, generation: job.generation + 1, resumeStep: m.stopStep });
  return jobs;
}

/**
 * The model's view: every started job, sorted by id so plans do not depend on arrival order,
 * then the jobs a cluster scheduler says MonkeyTree must count but never move, and the hosts
 * it says no worker may move to.
 */
export function clusterOf(state: DurableState, pinned: readonly Job[] = [], unavailable: readonly number[] = []): Cluster {
  const jobs = [...state.jobs.values()].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  return clusterFromSnapshot({
    topology: state.topology,
    lambda: state.lambda,
    ...(state.podLambda === null ? {} : { podLambda: state.podLambda }),
    jobs: [...jobs.map((job) => ({ id: job.id, rings: job.rings, groups: job.groups.map((g) => [...g]) })), ...pinned],
    ...(unavailable.length ? { unavailable: [...unavailable] } : {}),
  });
}

const topologyCluster = (state: DurableState): Cluster => clusterFromSnapshot({ topology: state.topology, lambda: state.lambda, jobs: [] });
