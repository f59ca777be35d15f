import { podOfRack, type Cluster } from "../model/cluster.ts";
import { hopBySourcePort, ROCE_V2_PORT, SCAN_ORDER, UDP, type SwitchHashModel } from "./ecmp.ts";
import type { Path } from "./paths.ts";

/** A flow's endpoints as the hash sees them and as the core links see them. */
export interface CoreFlow {
  readonly srcAddress: number;
  readonly dstAddress: number;
  readonly srcRack: number;
  readonly dstRack: number;
}

/**
 * Moves inter-pod flows onto core switches their source port can actually reach.
 *
 * An inter-pod path is three U-way ECMP choices (rack uplink, core link, core downlink); at
 * U = 32 that is 2^15 paths, more than the 2^14 ephemeral source ports, and a linear hash
 * such as CRC reaches fewer still. The rack uplink and the destination downlink are fixed by
 * the pod-level colouring, but the core switch usually has slack (the core step needs few
 * colours), so each flow whose core switch no port reaches is moved to a reachable one with
 * the fewest flows already on its two core links: an empty one keeps isolation; a shared one
 * is still better than a path the daemon cannot pin, which would land wherever ECMP puts it.
 * Flows are handled in order, so the result is deterministic; `paths` is left untouched.
 */
export function reachableCores<P extends Path>(cluster: Cluster, flows: readonly CoreFlow[], paths: readonly P[], model: SwitchHashModel): P[] {
  const links = cluster.topology.uplinksPerRack;
  const podOf = (rack: number) => podOfRack(cluster, rack);
  const upKey = (f: CoreFlow, p: Path, core: number) => (podOf(f.srcRack) * links + p.uplink) * links + core;
  const downKey = (f: CoreFlow, p: Path, core: number) => (podOf(f.dstRack) * links + p.downlink) * links + core;
  const up = new Int32Array(cluster.podCount * links * links);
  const down = new Int32Array(cluster.podCount * links * links);
  flows.forEach((f, t) => {
    const p = paths[t]!;
    if (p.core === null) return;
    up[upKey(f, p, p.core)]!++;
    down[downKey(f, p, p.core)]!++;
  });

  return paths.map((p, t) => {
    const f = flows[t]!;
    if (p.core === null) return p;
    const reachable = coresReachable(f, p, p.core, links, model);
    if (reachable.has(p.core) || reachable.size === 0) return p;
    up[upKey(f, p, p.core)]!--;
    down[downKey(f, p, p.core)]!--;
    let best = -1;
    let bestLoad = Infinity;
    for (const core of [...reachable].sort((a, b) => a - b)) {
      const load = Math.max(up[upKey(f, p, core)]!, down[downKey(f, p, core)]!);
      if (load < bestLoad) {
        best = core;
        bestLoad = load;
      }
    }
    up[upKey(f, p, best)]!++;
    down[downKey(f, p, best)]!++;
    return { ...p, core: best };
  });
}

/**
 * Core switches some ephemeral port reaches while keeping the flow's uplink and downlink; the
 * scan stops early once `wanted` is among them.
 */
function coresReachable(flow: CoreFlow, path: Path, wanted: number, links: number, model: SwitchHashModel): Set<number> {
  const reachable = new Set<number>();
  const tuple = { srcAddress: flow.srcAddress, dstAddress: flow.dstAddress, protocol: UDP, dstPort: ROCE_V2_PORT };
  const [tor, core, aggregation] = (["tor", "core", "aggregation"] as const).map((tier) => hopBySourcePort(model, tuple, links, tier));
  for (const port of SCAN_ORDER) {
    if (reachable.has(wanted)) break;
    if (tor!(port) !== path.uplink || core!(port) !== path.downlink) continue;
    reachable.add(aggregation!(port));
  }
  return reachable;
}
