import { z } from "zod";
import { envelope, HostSchema, JobIdSchema } from "./envelope.ts";

/** An operator credential may ask the controller what it holds (anyone, without a keyring). */
export const StatusRequestSchema = z.strictObject({ ...envelope("status") });
export type StatusRequest = z.infer<typeof StatusRequestSchema>;

const count = z.int().min(0);

export const MigrationSummarySchema = z.strictObject({
  id: z.string(),
  job: JobIdSchema,
  group: count,
  from: HostSchema,
  to: HostSchema,
  planStep: count,
  state: z.string(),
  stopStep: count.nullable(),
  reason: z.string().nullable(),
  /** States entered so far and when (ms since the epoch, the controller's clock). */
  history: z.array(z.strictObject({ state: z.string(), at: z.number() })),
});

export const StatusReportSchema = z.strictObject({
  ...envelope("status.report"),
  topology: z.strictObject({ racks: count, hostsPerRack: count, gpusPerHost: count, uplinksPerRack: count }),
  lambda: count,
  /** Started jobs, and jobs still waiting for some of their workers to register. */
  jobs: z.array(z.strictObject({ id: JobIdSchema, hosts: z.array(HostSchema), expected: count, started: z.boolean(), generation: count })),
  workers: count,
  hosts: z.strictObject({ registered: count, lost: z.array(HostSchema) }),
  fragmentation: z.array(count),
  withinBounds: z.boolean(),
  /** Perfect routing of the current placement: whether every DP flow has links of its own. */
  routes: z.strictObject({ isolated: z.boolean(), dpFlows: count, maxFlowsPerLink: count }),
  /** Moves of the latest plan. */
  migrations: z.array(MigrationSummarySchema),
  journalRecords: count,
});
export type StatusReport = z.infer<typeof StatusReportSchema>;
