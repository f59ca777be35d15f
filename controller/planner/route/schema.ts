import { z } from "zod";
import { EPHEMERAL_PORTS } from "./ecmp.ts";

/**
 * The routing document `monkeytree routes --json` prints and host daemons consume: per DP
 * flow its dedicated path and the source port that steers it there, per rack the load on its
 * links, and whether the result isolates every DP flow.
 */

const index = z.int().min(0);
const port = z.int().min(EPHEMERAL_PORTS.first).max(EPHEMERAL_PORTS.last);

const pathFields = {
  srcHost: index,
  dstHost: index,
  srcRack: index,
  dstRack: index,
  /** Source rack's uplink. */
  uplink: index,
  /** The switch above that uplink: the spine (2-tier) or the source pod's aggregation switch. */
  spine: index,
  /** Destination rack's downlink (its spine or aggregation switch in the destination pod). */
  downlink: index,
  /** Core switch of an inter-pod flow; null inside a pod or in a 2-tier Clos. */
  core: index.nullable(),
  /** UDP source port that ECMP-hashes onto this path; null when no ephemeral port does. */
  sourcePort: port.nullable(),
};

export const DpRouteSchema = z.strictObject({
  job: z.string(),
  /** Index in the job's `groups` (its pipeline stage); 0 for a job given as `hosts`. */
  group: index,
  ring: index,
  /** Colour at the source rack, before any fold onto uplinks. */
  colour: index,
  ...pathFields,
});
export type DpRoute = z.infer<typeof DpRouteSchema>;

export const PpRouteSchema = z.strictObject({
  job: z.string(),
  /** Pipeline stages (indices in the job's `groups`): activations go forward, gradients back. */
  fromStage: index,
  toStage: index,
  replica: index,
  ...pathFields,
});
export type PpRoute = z.infer<typeof PpRouteSchema>;

export const RackRouteLoadSchema = z.strictObject({
  rack: index,
  flowsOut: index,
  flowsIn: index,
  uplinks: index,
  /** Most flows leaving through one uplink; 1 means every outgoing flow has its own. */
  maxFlowsPerUplink: index,
  /** Most flows arriving through one downlink (the spine-to-rack side of an uplink). */
  maxFlowsPerDownlink: index,
});
export type RackLoad = Readonly<z.infer<typeof RackRouteLoadSchema>>;

export const PodRouteLoadSchema = z.strictObject({
  pod: index,
  flowsOut: index,
  flowsIn: index,
  /** Core-facing links of the pod: U aggregation switches × U links. */
  coreLinks: index,
  /** Most inter-pod DP flows on one aggregation-to-core link. */
  maxFlowsPerCoreUplink: index,
  /** Most inter-pod DP flows on one core-to-aggregation link into the pod. */
  maxFlowsPerCoreDownlink: index,
});

export const RoutesSchema = z.strictObject({
  tiers: z.union([z.literal(2), z.literal(3)]),
  uplinksPerRack: index,
  /** Colours the rack-level colouring needed: Δ (with a pod tier, including pod-boundary endpoints). */
  delta: index,
  /** Colours the core step needed; null in a 2-tier Clos. */
  coreDelta: index.nullable(),
  /** Colours were folded onto fewer links, so some links may carry several DP flows. */
  folded: z.boolean(),
  /** Every link carries at most one DP flow. */
  isolated: z.boolean(),
  overlap: z.strictObject({
    /** Most DP flows on any one link. */
    maxFlowsPerLink: index,
    /** Racks with an uplink or downlink carrying more than one DP flow. */
    racks: z.array(index),
    /** Pods with a core-facing link carrying more than one DP flow. */
    pods: z.array(index),
  }),
  hashModel: z.string(),
  /** Flows (DP and PP) for which no source port steers onto the assigned path. */
  unsteered: index,
  /** Host order of every group's ring(s), in snapshot order. */
  ringOrders: z.array(z.strictObject({ job: z.string(), group: index, order: z.array(index) })),
  racks: z.array(RackRouteLoadSchema),
  pods: z.array(PodRouteLoadSchema),
  dpFlows: z.array(DpRouteSchema),
  ppFlows: z.array(PpRouteSchema),
});
export type Routes = z.infer<typeof RoutesSchema>;
