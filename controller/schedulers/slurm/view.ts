import { MAX_GPUS_PER_HOST } from "../../../sdk/contract/protocol/limits.ts";
import type { NamedTopology } from "../../planner/model/named-topology.ts";
import type { SlurmJob, SlurmNode } from "./reports.ts";

/**
 * What Slurm's reports mean for the planner, as a pure function: which jobs MonkeyTree must
 * count but never move (every running job whose launchers did not register: pinned), and which
 * hosts no worker may move to (unavailable). Slurm owns the hosts, so a host is a destination
 * only when Slurm would not hand it to anyone else: idle with no flag against it, or running
 * only MonkeyTree's own jobs (a swap's destination), or held by MonkeyTree for a moved worker.
 */

/** A job's comment carries its rings (TP degree) as `monkeytree:rings=N`; 1 without it. */
export const RINGS_COMMENT = /(?:^|[\s,;])monkeytree:rings=(\d+)(?=$|[\s,;])/;

/**
 * What a pinned job's `monkeytree:rings=N` counts for. Anyone who submits a job writes its
 * comment, so it is never believed past what the job could carry: `bounded` (the default) takes
 * it up to the GPUs the job has on the rack where it has fewest (a DP ring leaves a rack as
 * one flow, and a rack's GPUs make at most one ring each); `ignore` counts every pinned job as 1.
 */
export const COMMENT_POLICIES = ["bounded", "ignore"] as const;
export type CommentPolicy = (typeof COMMENT_POLICIES)[number];

/** Jobs that hold their nodes: a pinned job counts wherever it has nodes. */
const HOLDING_STATES = new Set(["RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STOPPED", "RESIZING", "SIGNALING", "STAGE_OUT"]);
/** Node states Slurm would not start a job in, or that mean the node is gone. */
const UNUSABLE_STATES = new Set(["down", "error", "future", "unknown"]);
/** Node flags that keep Slurm from starting jobs there, or mean it is going away. */
const UNUSABLE_FLAGS = new Set([
  "DRAIN",
  "DRAINING",
  "DRAINED",
  "MAINTENANCE",
  "RESERVED",
  "NOT_RESPONDING",
  "POWERED_DOWN",
  "POWERING_DOWN",
  "POWERING_UP",
  "POWER_DOWN",
  "FAIL",
  "REBOOT_REQUESTED",
  "REBOOT_ISSUED",
  "INVALID_REG",
  // Idle, but the backfill scheduler means to start a pending job there.
  "PLANNED",
]);

export interface PinnedJob {
  /** The Slurm job id. */
  readonly id: string;
  readonly rings: number;
  /** Global indices of its nodes in the topology, ascending. */
  readonly hosts: readonly number[];
}

export interface UnavailableHost {
  readonly host: number;
  /** Why, for status and logs: "drained (maintenance)", "allocated to Slurm job 12", … */
  readonly why: string;
}

export interface SlurmView {
  readonly pinned: readonly PinnedJob[];
  readonly unavailable: readonly UnavailableHost[];
  /** Things the view left out, one line each: nodes outside the topology, bad ring comments. */
  readonly notes: readonly string[];
}

export interface ViewInput {
  readonly topology: NamedTopology;
  readonly nodes: readonly SlurmNode[];
  readonly jobs: readonly SlurmJob[];
  /** Slurm job ids whose workers registered with MonkeyTree: movable, not pinned. */
  readonly managed: ReadonlySet<string>;
  /** Nodes MonkeyTree holds (its reservations), where moved workers run or are about to. */
  readonly held: ReadonlySet<string>;
  /**
   * Every other reservation's nodes, by reservation name. Read from the reservations, not the
   * nodes' RESERVED flag: slurmctld sets that flag only on its next periodic check, seconds after.
   */
  readonly reserved: ReadonlyMap<string, string>;
  /** How pinned jobs' ring comments count (default `bounded`). */
  readonly comments?: CommentPolicy;
}

export function slurmView(input: ViewInput): SlurmView {
  const { topology, managed, held } = input;
  const notes: string[] = [];
  const outside = new Set<string>();
  const indexOf = (node: string): number | undefined => {
    const index = topology.hostIndex.get(node);
    if (index === undefined) outside.add(node);
    return index;
  };

  const pinned: PinnedJob[] = [];
  const foreignJobsOn = new Map<string, string[]>();
  for (const job of input.jobs) {
    if (!HOLDING_STATES.has(job.state) || job.nodes.length === 0) continue;
    if (managed.has(job.id)) continue;
    for (const node of job.nodes) foreignJobsOn.set(node, [...(foreignJobsOn.get(node) ?? []), job.id]);
    const hosts = job.nodes.flatMap((node) => indexOf(node) ?? []).sort((a, b) => a - b);
    if (hosts.length === 0) continue;
    pinned.push({ id: job.id, rings: ringsOf(job, ringBound(topology, hosts), input.comments ?? "bounded", notes), hosts });
  }
  pinned.sort((a, b) => Number(a.id) - Number(b.id) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));

  const byName = new Map(input.nodes.map((node) => [node.name, node]));
  for (const node of byName.keys()) indexOf(node);
  const unavailable: UnavailableHost[] = [];
  topology.hostNames.forEach((name, host) => {
    const why = name === null ? "an empty slot of a short rack" : unusable(name, byName.get(name), foreignJobsOn.get(name), held, input.reserved.get(name));
    if (why !== null) unavailable.push({ host, why });
  });
  if (outside.size) notes.push(`Slurm nodes outside the topology, left out: ${[...outside].sort().slice(0, 8).join(", ")}${outside.size > 8 ? ", …" : ""}`);
  return { pinned, unavailable, notes };
}

/** Why a worker may not move to `name`, or null when it may. */
function unusable(
  name: string,
  node: SlurmNode | undefined,
  foreignJobs: readonly string[] | undefined,
  held: ReadonlySet<string>,
  reservation: string | undefined,
): string | null {
  if (!node) return "Slurm does not report this node";
  if (UNUSABLE_STATES.has(node.state)) return `${node.state}${node.reason ? ` (${node.reason})` : ""}`;
  if (reservation !== undefined) return `reserved (${reservation})`;
  const flags = node.flags.filter((flag) => UNUSABLE_FLAGS.has(flag) && !(flag === "RESERVED" && held.has(name)));
  if (flags.length) return `${flags.map((f) => f.toLowerCase()).join(", ")}${node.reason ? ` (${node.reason})` : ""}`;
  if (foreignJobs?.length) return `allocated to Slurm job ${foreignJobs.join(", ")}`;
  // Allocated with no foreign job: MonkeyTree's own jobs, whose workers a swap may exchange.
  return null;
}

/** The most rings a job on `hosts` can make leave a rack: its GPUs on the rack where it has fewest. */
export function ringBound(topology: NamedTopology, hosts: readonly number[]): number {
  const { hostsPerRack, gpusPerHost } = topology.topology;
  const perRack = new Map<number, number>();
  for (const host of hosts) perRack.set(Math.floor(host / hostsPerRack), (perRack.get(Math.floor(host / hostsPerRack)) ?? 0) + 1);
  return gpusPerHost * Math.min(...perRack.values());
}

function ringsOf(job: SlurmJob, bound: number, policy: CommentPolicy, notes: string[]): number {
  const match = policy === "ignore" ? null : RINGS_COMMENT.exec(job.comment);
  if (!match) return 1;
  const rings = Number(match[1]);
  if (!(rings >= 1 && rings <= MAX_GPUS_PER_HOST)) {
    notes.push(`Slurm job ${job.id}: monkeytree:rings=${match[1]} is not from 1 to ${MAX_GPUS_PER_HOST}; counted as 1`);
    return 1;
  }
  if (rings <= bound) return rings;
  notes.push(
    `Slurm job ${job.id}: monkeytree:rings=${rings} is more than its allocation carries (${bound} GPUs on the rack where it has fewest); counted as ${bound}`,
  );
  return bound;
}
