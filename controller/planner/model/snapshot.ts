import { z } from "zod";
import {
  idSchema,
  MAX_FRAGMENTATION,
  MAX_GPUS_PER_HOST,
  MAX_HOSTS,
  MAX_HOSTS_PER_RACK,
  MAX_RACKS,
  MAX_UPLINKS_PER_RACK,
} from "../../../sdk/contract/protocol/limits.ts";

/**
 * A cluster snapshot: the topology, the fragmentation bounds, and where the cluster's own
 * scheduler put every job. This is the planner's input (`monkeytree plan --snapshot FILE`) and
 * the shape the controller keeps its placement state in.
 */

/** A whole number from 1 to `max`, the largest the planner and routing support (sdk/contract/protocol/limits.ts). */
const count = (what: string, max: number) =>
  z
    .int({ error: `${what} must be a whole number` })
    .min(1, { error: `${what} must be at least 1` })
    .max(max, { error: `${what} must be at most ${max}, the largest MonkeyTree supports` });
const bound = (what: string) =>
  z
    .int({ error: `${what} must be a whole number` })
    .min(0, { error: `${what} must not be negative` })
    .max(MAX_FRAGMENTATION, { error: `${what} must be at most ${MAX_FRAGMENTATION}, the highest fragmentation degree any supported cluster can have` });
const host = z.int({ error: "a host is a whole-number global index" }).min(0, { error: "host indices start at 0" });

export const TopologySchema = z
  .strictObject({
    racks: count("racks", MAX_RACKS),
    hostsPerRack: count("hostsPerRack", MAX_HOSTS_PER_RACK),
    gpusPerHost: count("gpusPerHost", MAX_GPUS_PER_HOST),
    uplinksPerRack: count("uplinksPerRack", MAX_UPLINKS_PER_RACK),
    /** 3-tier Clos: racks are grouped into pods of this many consecutive racks. */
    racksPerPod: count("racksPerPod", MAX_RACKS).optional(),
  })
  .refine(({ racks, hostsPerRack }) => racks * hostsPerRack <= MAX_HOSTS, {
    path: ["hostsPerRack"],
    // Only when each number is valid on its own; otherwise that is the problem to report.
    when: (payload) => payload.issues.length === 0,
    error: ({ input }) => {
      const { racks, hostsPerRack } = input as { racks: number; hostsPerRack: number };
      return `racks × hostsPerRack (${racks} × ${hostsPerRack}) must be at most ${MAX_HOSTS} hosts, the largest MonkeyTree supports`;
    },
  });
export type Topology = z.infer<typeof TopologySchema>;

export const JobSchema = z
  .strictObject({
    id: idSchema("a job id"),
    /** Independent DP rings per fragmented rack: the job's TP degree, 1 for pure DP/FSDP. */
    rings: count("rings", MAX_GPUS_PER_HOST).default(1),
    /** One DP replica group (pure DP/FSDP). */
    hosts: z.array(host).min(1, { error: "a job needs at least one host" }).optional(),
    /** One group per pipeline stage. */
    groups: z
      .array(z.array(host).min(1, { error: "a group needs at least one host" }))
      .min(1, { error: "groups must list at least one group" })
      .optional(),
    /**
     * `false` pins the job where it is: its workers still count in every rack's fragmentation,
     * but no plan moves them or swaps with them. Absent means movable.
     */
    movable: z.boolean({ error: "movable must be true or false" }).optional(),
  })
  .refine((job) => (job.hosts === undefined) !== (job.groups === undefined), {
    error: "a job lists either `hosts` (one group) or `groups` (one per PP stage), exactly one of them",
  });
export type Job = z.infer<typeof JobSchema>;

export const SnapshotSchema = z
  .strictObject({
    topology: TopologySchema,
    /** Per-rack fragmentation bound; defaults to `topology.uplinksPerRack`. */
    lambda: bound("lambda").optional(),
    /** Per-pod fragmentation bound (MonkeyTree3); needs `topology.racksPerPod`. */
    podLambda: bound("podLambda").optional(),
    jobs: z.array(JobSchema),
    /**
     * Hosts no plan may use as a destination (drained, reserved, down). A worker already on
     * one counts as placed there and may stay; it is never required to leave.
     */
    unavailable: z.array(host).optional(),
  })
  .superRefine((snap, ctx) => {
    const { racks, hostsPerRack, racksPerPod } = snap.topology;
    if (racksPerPod !== undefined && racks % racksPerPod !== 0) {
      ctx.addIssue({
        code: "custom",
        path: ["topology", "racksPerPod"],
        message: `racksPerPod (${racksPerPod}) must divide racks (${racks}) so every pod is whole`,
      });
    }
    if (snap.podLambda !== undefined && racksPerPod === undefined) {
      ctx.addIssue({
        code: "custom",
        path: ["podLambda"],
        message: "podLambda needs topology.racksPerPod; add it or drop podLambda",
      });
    }
    const hostCount = racks * hostsPerRack;
    const outOfRange = (h: number) => `host ${h} is out of range: the topology has hosts 0..${hostCount - 1} (${racks} racks × ${hostsPerRack} hosts)`;
    const listed = new Set<number>();
    snap.unavailable?.forEach((h, i) => {
      if (h >= hostCount) {
        ctx.addIssue({ code: "custom", path: ["unavailable", i], message: `${outOfRange(h)}; list only hosts of the topology` });
      } else if (listed.has(h)) {
        ctx.addIssue({ code: "custom", path: ["unavailable", i], message: `host ${h} is listed twice; list each unavailable host once` });
      }
      listed.add(h);
    });
    const owner = new Map<number, string>();
    const ids = new Set<string>();
    snap.jobs.forEach((job, j) => {
      if (ids.has(job.id)) {
        ctx.addIssue({ code: "custom", path: ["jobs", j, "id"], message: `job id "${job.id}" is used twice; ids must be unique` });
      }
      ids.add(job.id);
      const groups = job.groups ?? [job.hosts ?? []];
      groups.forEach((members, g) => {
        members.forEach((h, i) => {
          const path = job.groups ? ["jobs", j, "groups", g, i] : ["jobs", j, "hosts", i];
          if (h >= hostCount) {
            ctx.addIssue({
              code: "custom",
              path,
              message: outOfRange(h),
            });
            return;
          }
          const previous = owner.get(h);
          if (previous !== undefined) {
            ctx.addIssue({
              code: "custom",
              path,
              message: `host ${h} is already used by ${previous}; a host runs one worker`,
            });
            return;
          }
          owner.set(h, job.groups ? `job "${job.id}" group ${g}` : `job "${job.id}"`);
        });
      });
    });
  });
export type Snapshot = z.infer<typeof SnapshotSchema>;
/** What a snapshot file may contain before defaults are applied. */
export type SnapshotInput = z.input<typeof SnapshotSchema>;
