import { z } from "zod";
import { envelope, HostSchema, JobIdSchema } from "./envelope.ts";
import { idSchema, MAX_LIST_LENGTH, textSchema } from "./limits.ts";

/** An operator credential may ask the controller what it holds (anyone, without a keyring). */
export const StatusRequestSchema = z.strictObject({ ...envelope("status") });
export type StatusRequest = z.infer<typeof StatusRequestSchema>;

const count = z.int().min(0);
const list = <T extends z.ZodType>(item: T) => z.array(item).max(MAX_LIST_LENGTH);

export const MigrationSummarySchema = z.strictObject({
  id: idSchema("migration id"),
  job: JobIdSchema,
  group: count,
  from: HostSchema,
  to: HostSchema,
  planStep: count,
  state: textSchema("state"),
  stopStep: count.nullable(),
  reason: textSchema("reason").nullable(),
  /** States entered so far and when (ms since the epoch, the controller's clock). */
  history: list(z.strictObject({ state: textSchema("state"), at: z.number() })),
});

export const StatusReportSchema = z.strictObject({
  ...envelope("status.report"),
  topology: z.strictObject({ racks: count, hostsPerRack: count, gpusPerHost: count, uplinksPerRack: count }),
  lambda: count,
  /**
   * Started jobs, and jobs still waiting for some of their workers to register. `lost`, present
   * when some are: the hosts whose worker's launcher heartbeated and then fell silent for the
   * controller's worker heartbeat timeout. A job lost on every host ends after the controller's
   * lost-job grace, unless one of its launchers is heard again.
   */
  jobs: list(
    z.strictObject({
      id: JobIdSchema,
      hosts: list(HostSchema),
      expected: count,
      started: z.boolean(),
      generation: count,
      /** The furthest barrier its launchers reported, and the slowest host's recent step time; absent before the first report. */
      step: count.optional(),
      stepSeconds: z.number().min(0).nullable().optional(),
      lost: list(HostSchema).optional(),
    }),
  ),
  workers: count,
  hosts: z.strictObject({ registered: count, lost: list(HostSchema) }),
  fragmentation: list(count),
  withinBounds: z.boolean(),
  /** Perfect routing of the current placement: whether every DP flow has links of its own. */
  routes: z.strictObject({ isolated: z.boolean(), dpFlows: count, maxFlowsPerLink: count }),
  /** Moves of the latest plan. */
  migrations: list(MigrationSummarySchema),
  journalRecords: count,
  /** Where a cluster scheduler owns the hosts (Slurm): what it says of them. */
  scheduler: z
    .strictObject({
      /** Jobs that did not register: counted where they run, never moved. */
      pinned: list(z.strictObject({ id: JobIdSchema, rings: count, hosts: list(HostSchema) })),
      /** Hosts no worker may move to, and why. */
      unavailable: list(z.strictObject({ host: HostSchema, why: textSchema("why") })),
      /** The scheduler's reservations that keep MonkeyTree's destinations. */
      holds: list(z.strictObject({ name: textSchema("hold"), job: JobIdSchema, node: textSchema("node") })),
    })
    .optional(),
});
export type StatusReport = z.infer<typeof StatusReportSchema>;
