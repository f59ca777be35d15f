import { podOfRack, type Cluster, type Placement } from "../model/cluster.ts";
import { crc32HashModel, defaultAddressOf, steerPorts, type SwitchHashModel } from "./ecmp.ts";
import { reachableCores } from "./core-steering.ts";
import { colourEdges } from "./edge-colouring.ts";
import { dpFlows, ppFlows } from "./flows.ts";
import { hashHops, routePipelineFlows, type ColourMethod, type Path } from "./paths.ts";
import { ringOrders } from "./ring-order.ts";
import type { DpRoute, PpRoute, Routes } from "./schema.ts";
import { routeThreeTier } from "./three-tier.ts";
import { routeTwoTier } from "./two-tier.ts";
import { rackLoads } from "./uplinks.ts";

export interface RouteOptions {
  /** Ring orders currently in use, indexed like `cluster.groups`; kept where still valid. */
  readonly previousOrders?: Placement;
  /** The switches' ECMP hash; defaults to CRC-32 5-tuple hashing (see `ecmp.ts`). */
  readonly hashModel?: SwitchHashModel;
  /** RoCE address of a host as an unsigned 32-bit IPv4; defaults to 10.0.0.0 + host + 1. */
  readonly addressOf?: (host: number) => number;
  /** Edge colouring for the DP flows; defaults to alternating-path colouring. */
  readonly colour?: ColourMethod;
}

/**
 * Perfect routing for a whole cluster: ring orders, DP flows with dedicated uplinks (and core
 * links in a 3-tier Clos), PP flows spread round-robin, and for every flow the UDP source port
 * that steers it. Pure and deterministic: the same cluster and options give the same routes.
 */
export function routeCluster(cluster: Cluster, options: RouteOptions = {}): Routes {
  const colour = options.colour ?? colourEdges;
  const model = options.hashModel ?? crc32HashModel();
  const addressOf = options.addressOf ?? defaultAddressOf;
  const { racks, uplinksPerRack: links, racksPerPod } = cluster.topology;
  const threeTier = racksPerPod !== undefined;

  const orders = ringOrders(cluster, options.previousOrders);
  const dp = dpFlows(cluster, orders);
  const pp = ppFlows(cluster, orders);
  const routing = threeTier ? routeThreeTier(cluster, dp, colour) : { ...routeTwoTier(cluster, dp, colour), coreDelta: null };
  const addressed = <F extends { srcHost: number; dstHost: number }>(f: F) => ({
    ...f,
    srcAddress: addressOf(f.srcHost),
    dstAddress: addressOf(f.dstHost),
  });
  const dpEnds = dp.map(addressed);
  const ppEnds = pp.map(addressed);
  // DP and PP flows are moved between core switches separately: DP flows must not share links
  // with each other, PP flows only spread among themselves.
  const dpPaths = threeTier ? reachableCores(cluster, dpEnds, routing.paths, model) : routing.paths;
  const ppPaths = routePipelineFlows(cluster, pp);
  const endpoints = [...dpEnds, ...ppEnds];
  const paths: Path[] = [...dpPaths, ...(threeTier ? reachableCores(cluster, ppEnds, ppPaths, model) : ppPaths)];
  const ports = steerPorts(
    endpoints.map((f, i) => ({ srcAddress: f.srcAddress, dstAddress: f.dstAddress, hops: hashHops(cluster, paths[i]!) })),
    model,
  );
  const pathFields = (i: number) => {
    const f = endpoints[i]!;
    const p = paths[i]!;
    return {
      srcHost: f.srcHost,
      dstHost: f.dstHost,
      srcRack: f.srcRack,
      dstRack: f.dstRack,
      uplink: p.uplink,
      spine: p.uplink,
      downlink: p.downlink,
      core: p.core,
      sourcePort: ports[i] ?? null,
    };
  };
  const groupOf = (g: number) => cluster.groups[g] ?? { job: "", index: 0 };
  const dpRoutes: DpRoute[] = dp.map((f, i) => ({
    job: groupOf(f.group).job,
    group: groupOf(f.group).index,
    ring: f.ring,
    colour: dpPaths[i]!.colour,
    ...pathFields(i),
  }));
  const ppRoutes: PpRoute[] = pp.map((f, i) => ({
    job: groupOf(f.fromGroup).job,
    fromStage: groupOf(f.fromGroup).index,
    toStage: groupOf(f.toGroup).index,
    replica: f.replica,
    ...pathFields(dp.length + i),
  }));

  const rackLoad = rackLoads(racks, links, dpRoutes);
  const podLoad = threeTier ? podLoads(cluster, dpRoutes) : [];
  const overlap = overlapOf(rackLoad, podLoad);
  return {
    tiers: threeTier ? 3 : 2,
    uplinksPerRack: links,
    delta: routing.delta,
    coreDelta: routing.coreDelta,
    folded: routing.delta > links || (routing.coreDelta ?? 0) > links,
    isolated: overlap.maxFlowsPerLink <= 1,
    overlap,
    hashModel: model.name,
    unsteered: ports.filter((p) => p === null).length,
    ringOrders: orders.map((order, g) => ({ job: groupOf(g).job, group: groupOf(g).index, order })),
    racks: rackLoad,
    pods: podLoad,
    dpFlows: dpRoutes,
    ppFlows: ppRoutes,
  };
}

/** The most DP flows any link carries, and the racks and pods where a link carries more than one. */
function overlapOf(rackLoad: Routes["racks"], podLoad: Routes["pods"]): Routes["overlap"] {
  const maxFlowsPerLink = Math.max(
    0,
    ...rackLoad.flatMap((r) => [r.maxFlowsPerUplink, r.maxFlowsPerDownlink]),
    ...podLoad.flatMap((p) => [p.maxFlowsPerCoreUplink, p.maxFlowsPerCoreDownlink]),
  );
  return {
    maxFlowsPerLink,
    racks: rackLoad.filter((r) => r.maxFlowsPerUplink > 1 || r.maxFlowsPerDownlink > 1).map((r) => r.rack),
    pods: podLoad.filter((p) => p.maxFlowsPerCoreUplink > 1 || p.maxFlowsPerCoreDownlink > 1).map((p) => p.pod),
  };
}

/**
 * Inter-pod DP flows per pod and on its busiest core-facing links: aggregation (P,i) to core
 * j going up, core j to aggregation (Q,i') coming down.
 */
export function podLoads(cluster: Cluster, routes: readonly DpRoute[]): Routes["pods"] {
  const links = cluster.topology.uplinksPerRack;
  const perPod = links * links;
  const up = new Int32Array(cluster.podCount * perPod);
  const down = new Int32Array(cluster.podCount * perPod);
  for (const r of routes) {
    if (r.core === null) continue;
    up[podOfRack(cluster, r.srcRack) * perPod + r.uplink * links + r.core]!++;
    down[podOfRack(cluster, r.dstRack) * perPod + r.downlink * links + r.core]!++;
  }
  return Array.from({ length: cluster.podCount }, (_, pod) => {
    const ups = up.subarray(pod * perPod, (pod + 1) * perPod);
    const downs = down.subarray(pod * perPod, (pod + 1) * perPod);
    return {
      pod,
      flowsOut: ups.reduce((a, b) => a + b, 0),
      flowsIn: downs.reduce((a, b) => a + b, 0),
      coreLinks: perPod,
      maxFlowsPerCoreUplink: ups.reduce((a, b) => Math.max(a, b), 0),
      maxFlowsPerCoreDownlink: downs.reduce((a, b) => Math.max(a, b), 0),
    };
  });
}

export { RoutesSchema, DpRouteSchema, PpRouteSchema, type Routes, type DpRoute, type PpRoute, type RackLoad } from "./schema.ts";
export { colourEdges, maxDegree, isProperColouring, type BipartiteMultigraph, type EdgeColouring } from "./edge-colouring.ts";
export { colourByRegularMatchings } from "./hopcroft-karp.ts";
export { ringOrders, ringOrder, isContiguous } from "./ring-order.ts";
export { dpFlows, ppFlows, type DpFlow, type PpFlow } from "./flows.ts";
export { foldColours, rackLoads } from "./uplinks.ts";
export {
  crc32,
  crc32HashModel,
  steerPorts,
  tupleBytes,
  defaultAddressOf,
  ROCE_V2_PORT,
  EPHEMERAL_PORTS,
  SCAN_ORDER,
  type SwitchHashModel,
  type FiveTuple,
  type Tier,
} from "./ecmp.ts";
export type { ColourMethod } from "./paths.ts";
