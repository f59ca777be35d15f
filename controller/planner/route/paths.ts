import { podOfRack, type Cluster } from "../model/cluster.ts";
import type { BipartiteMultigraph, EdgeColouring } from "./edge-colouring.ts";
import type { HashHop } from "./ecmp.ts";
import type { PpFlow } from "./flows.ts";
import { RoundRobin } from "./uplinks.ts";

/** Which colouring routes the DP flows; both colour with exactly Δ colours. */
export type ColourMethod = (graph: BipartiteMultigraph) => EdgeColouring;

/**
 * Where one flow runs. `uplink` is the source rack's uplink (the spine, or the source pod's
 * aggregation switch); `downlink` is the destination rack's link from its spine or aggregation
 * switch; `core` is the core switch of an inter-pod flow, null otherwise.
 */
export interface Path {
  readonly uplink: number;
  readonly downlink: number;
  readonly core: number | null;
}

export interface DpPath extends Path {
  /** The flow's colour at its source rack, before any fold onto uplinks. */
  readonly colour: number;
}

/** The ECMP choices a flow must come out of to follow `path`. */
export function hashHops(cluster: Cluster, path: Path): HashHop[] {
  const members = cluster.topology.uplinksPerRack;
  const hops: HashHop[] = [{ tier: "tor", members, member: path.uplink }];
  if (path.core !== null) {
    hops.push({ tier: "aggregation", members, member: path.core }, { tier: "core", members, member: path.downlink });
  }
  return hops;
}

/**
 * Pipeline flows, round-robin per switch: over the source rack's uplinks and, for inter-pod
 * flows, over the aggregation switch's core links and over the destination rack's downlinks.
 */
export function routePipelineFlows(cluster: Cluster, flows: readonly PpFlow[]): Path[] {
  const rr = new RoundRobin(cluster.topology.uplinksPerRack);
  return flows.map((f) => {
    const uplink = rr.take(`up ${f.srcRack}`);
    const pod = podOfRack(cluster, f.srcRack);
    if (cluster.topology.racksPerPod === undefined || pod === podOfRack(cluster, f.dstRack)) {
      return { uplink, downlink: uplink, core: null };
    }
    return { uplink, core: rr.take(`agg ${pod}.${uplink}`), downlink: rr.take(`down ${f.dstRack}`) };
  });
}
