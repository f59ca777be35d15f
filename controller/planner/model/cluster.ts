import { InvalidInputError, type InputIssue } from "../../../sdk/contract/errors.ts";
import { MAX_HOSTS } from "../../../sdk/contract/protocol/limits.ts";
import { SnapshotSchema, type Snapshot, type Topology } from "./snapshot.ts";

/** One DP replica group: a whole pure-DP/FSDP job, or one pipeline stage of a job. */
export interface Group {
  readonly job: string;
  /** Index in the job's `groups`; 0 for a job given as `hosts`. */
  readonly index: number;
  /** Cross-rack DP flows this group adds to each rack it fragments (its TP degree). */
  readonly rings: number;
  /** False for a pinned job's groups: they count in fragmentation but never move. */
  readonly movable: boolean;
}

/** Hosts of every group, indexed like `Cluster.groups`. */
export type Placement = readonly (readonly number[])[];

/**
 * A validated snapshot, flattened for the algorithms: groups in snapshot order and the
 * derived bounds. Pure data; no I/O.
 */
export interface Cluster {
  readonly topology: Topology;
  readonly hostCount: number;
  /** Pods in the topology; 0 when the topology has no pod tier. */
  readonly podCount: number;
  readonly lambda: number;
  readonly podLambda: number | undefined;
  readonly groups: readonly Group[];
  readonly placement: Placement;
  /** Hosts that are never a destination, ascending; workers on them may stay. */
  readonly unavailable: readonly number[];
}

export function clusterFromSnapshot(snapshot: Snapshot): Cluster {
  const { topology } = snapshot;
  const groups: Group[] = [];
  const placement: number[][] = [];
  for (const job of snapshot.jobs) {
    const members = job.groups ?? [job.hosts ?? []];
    members.forEach((hosts, index) => {
      groups.push({ job: job.id, index, rings: job.rings, movable: job.movable ?? true });
      placement.push([...hosts]);
    });
  }
  return {
    topology,
    hostCount: topology.racks * topology.hostsPerRack,
    podCount: topology.racksPerPod ? topology.racks / topology.racksPerPod : 0,
    lambda: snapshot.lambda ?? topology.uplinksPerRack,
    podLambda: snapshot.podLambda,
    groups,
    placement,
    unavailable: [...new Set(snapshot.unavailable ?? [])].sort((a, b) => a - b),
  };
}

/**
 * Validates a parsed JSON value as a snapshot; throws `InvalidInputError` naming the field.
 * Lists are measured first: validation reports every bad element, so a snapshot with millions
 * of them would otherwise cost memory for millions of issues.
 */
export function parseSnapshot(value: unknown, source = "snapshot"): Cluster {
  const tooLong = oversizedList(value);
  if (tooLong) throw new InvalidInputError(source, [tooLong]);
  const result = SnapshotSchema.safeParse(value);
  if (!result.success) throw InvalidInputError.fromZod(source, result.error);
  return clusterFromSnapshot(result.data);
}

/**
 * The first list longer than any supported cluster allows, or null. Hosts are used once each,
 * so there are at most `MAX_HOSTS` jobs, groups and host entries in all. Anything not a list
 * where one belongs is left to the schema to report.
 */
function oversizedList(value: unknown): InputIssue | null {
  const { jobs, unavailable } = (value ?? {}) as { jobs?: unknown; unavailable?: unknown };
  const over = (path: string, what: string, n: number): InputIssue => ({
    path,
    message: `${n} ${what}; a snapshot holds at most ${MAX_HOSTS}, one per host of the largest cluster MonkeyTree supports`,
  });
  if (Array.isArray(unavailable) && unavailable.length > MAX_HOSTS) return over("unavailable", "unavailable hosts", unavailable.length);
  if (!Array.isArray(jobs)) return null;
  if (jobs.length > MAX_HOSTS) return over("jobs", "jobs", jobs.length);
  let entries = 0;
  for (const [j, job] of jobs.entries()) {
    const { hosts, groups } = (job ?? {}) as { hosts?: unknown; groups?: unknown };
    const lists = Array.isArray(groups) ? groups : [hosts];
    if (lists.length > MAX_HOSTS) return over(`jobs[${j}].groups`, "groups", lists.length);
    for (const list of lists) entries += Array.isArray(list) ? list.length : 0;
    if (entries > MAX_HOSTS) return over(`jobs[${j}]`, "host entries up to this job", entries);
  }
  return null;
}

/** Parses snapshot text (JSON); syntax errors become `InvalidInputError` too. */
export function parseSnapshotText(text: string, source = "snapshot"): Cluster {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    const detail = error instanceof Error ? error.message : String(error);
    throw new InvalidInputError(source, [{ path: "", message: `not valid JSON (${detail})` }]);
  }
  return parseSnapshot(value, source);
}

/** The snapshot document for a cluster with another placement (same topology and bounds). */
export function toSnapshot(cluster: Cluster, placement: Placement = cluster.placement): Snapshot {
  const jobs = new Map<string, { rings: number; movable: boolean; groups: number[][] }>();
  cluster.groups.forEach((group, g) => {
    const job = jobs.get(group.job) ?? { rings: group.rings, movable: group.movable, groups: [] };
    job.groups[group.index] = [...(placement[g] ?? [])];
    jobs.set(group.job, job);
  });
  return {
    topology: cluster.topology,
    lambda: cluster.lambda,
    ...(cluster.podLambda === undefined ? {} : { podLambda: cluster.podLambda }),
    jobs: [...jobs].map(([id, job]) => ({
      id,
      rings: job.rings,
      ...(job.groups.length === 1 ? { hosts: job.groups[0] } : { groups: job.groups }),
      ...(job.movable ? {} : { movable: false }),
    })),
    ...(cluster.unavailable.length > 0 ? { unavailable: [...cluster.unavailable] } : {}),
  };
}

export const rackOf = (cluster: Cluster, host: number): number => Math.floor(host / cluster.topology.hostsPerRack);
export const podOfRack = (cluster: Cluster, rack: number): number => (cluster.topology.racksPerPod ? Math.floor(rack / cluster.topology.racksPerPod) : 0);
