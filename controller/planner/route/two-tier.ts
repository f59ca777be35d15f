import type { Cluster } from "../model/cluster.ts";
import type { DpFlow } from "./flows.ts";
import type { ColourMethod, DpPath } from "./paths.ts";
import { foldColours } from "./uplinks.ts";

export interface DpRouting {
  readonly paths: DpPath[];
  /** Colours the rack-level colouring used (Δ of its graph). */
  readonly delta: number;
}

/**
 * Perfect routing in a 2-tier Clos (paper, "Perfect Routing"). Rack uplink i goes to spine i, so a flow
 * a→b of colour c runs a's uplink c, spine c, b's downlink c; a proper colouring of the
 * sender/receiver multigraph therefore gives every DP flow its own uplink and downlink.
 */
export function routeTwoTier(cluster: Cluster, flows: readonly DpFlow[], colour: ColourMethod): DpRouting {
  const racks = cluster.topology.racks;
  const graph = { left: racks, right: racks, from: flows.map((f) => f.srcRack), to: flows.map((f) => f.dstRack) };
  const colouring = colour(graph);
  const uplink = foldColours(graph, colouring, cluster.topology.uplinksPerRack);
  const paths = flows.map((_, e) => ({ colour: colouring.colours[e]!, uplink: uplink[e]!, downlink: uplink[e]!, core: null }));
  return { paths, delta: colouring.count };
}
