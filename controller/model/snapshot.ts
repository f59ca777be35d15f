import { z } from "zod";

/**
 * A cluster snapshot: the topology, the fragmentation bounds, and where the cluster's own
 * scheduler put every job. This is the planner's input (`monkeytree plan --snapshot FILE`) and
 * the shape the controller keeps its placement state in.
 */

const count = (what: string) =>
  z.int({ error: `${what} must be a whole number` }).min(1, { error: `${what} must be at least 1` });
const bound = (what: string) =>
  z.int({ error: `${what} must be a whole number` }).min(0, { error: `${what} must not be negative` });
const host = z
  .int({ error: "a host is a whole-number global index" })
  .min(0, { error: "host indices start at 0" });

export const TopologySchema = z.strictObject({
  racks: count("racks"),
  hostsPerRack: count("hostsPerRack"),
  gpusPerHost: count("gpusPerHost"),
  uplinksPerRack: count("uplinksPerRack"),
  /** 3-tier Clos: racks are grouped into pods of this many consecutive racks. */
  racksPerPod: count("racksPerPod").optional(),
});
export type Topology = z.infer<typeof TopologySchema>;

export const JobSchema = z
  .strictObject({
    id: z.string({ error: "a job id is a string" }).min(1, { error: "a job id must not be empty" }),
    /** Independent DP rings per fragmented rack: the job's TP degree, 1 for pure DP/FSDP. */
    rings: count("rings").default(1),
    /** One DP replica group (pure DP/FSDP). */
    hosts: z.array(host).min(1, { error: "a job needs at least one host" }).optional(),
    /** One group per pipeline stage. */
    groups: z
      .array(z.array(host).min(1, { error: "a group needs at least one host" }))
      .min(1, { error: "groups must list at least one group" })
      .optional(),
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
              message: `host ${h} is out of range: the topology has hosts 0..${hostCount - 1} (${racks} racks × ${hostsPerRack} hosts)`,
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
