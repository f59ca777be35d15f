import { podOfRack, type Cluster } from "../model/cluster.ts";
import type { DpFlow } from "./flows.ts";
import type { ColourMethod, DpPath } from "./paths.ts";
import type { DpRouting } from "./two-tier.ts";
import { foldColours } from "./uplinks.ts";

/**
 * Perfect routing in a 3-tier Clos, in the two coupled steps of the paper's section "Beyond
 * 2-tier Clos Topologies".
 *
 * Topology model, with U = `uplinksPerRack`:
 * - pods of `racksPerPod` consecutive racks; each pod has U aggregation switches, and rack
 *   uplink i goes to the pod's aggregation switch i (the pod is a 2-tier Clos);
 * - there are U core switches; aggregation switch i of every pod has U core-facing links,
 *   link j going to core switch j, and each core switch has one link to every aggregation
 *   switch of every pod (the paper's "second and core tiers are fully connected").
 * An inter-pod flow a→b (pods P→Q) runs a's uplink i, aggregation (P,i), core link j, core j,
 * core j's link to aggregation (Q,i'), b's downlink i'. i, j and i' are three independent
 * choices, which is what lets each step colour on its own; they are also three ECMP
 * decisions (rack, aggregation switch, core switch) that the source port must steer, which
 * `core-steering.ts` makes possible where ports are scarce.
 *
 * Step 1 colours each pod's rack-level flows, with the pod boundary as a virtual endpoint: an
 * inter-pod flow becomes an edge from its rack to an egress vertex of its pod and one from an
 * ingress vertex of the other pod to its rack. The endpoint is split into as few copies as
 * keeps every copy's degree within the colour budget C = max(Δ of the racks, ⌈pod inter-pod
 * flows / U⌉), so each colour (aggregation switch) carries at most ⌈E/C⌉ ≤ U of the pod's E
 * inter-pod flows: no more than its U core links.
 *
 * Step 2 colours the inter-pod flows between source aggregation switches (P,i) and
 * destination aggregation switches (Q,i'); colour j is the core switch. Each aggregation
 * switch then has at most one flow per core-facing link, up and down: isolation holds end to
 * end whenever every rack has at most U DP flows and every pod at most U² inter-pod ones
 * (a pod bound λ_pod ≤ U²). Otherwise colours fold onto links as in 2-tier, and the result
 * reports which racks and pods share links.
 */
export interface ThreeTierRouting extends DpRouting {
  /** Colours the core step used (Δ of the aggregation-to-aggregation graph). */
  readonly coreDelta: number;
}

/**
 * `coreLinks` is each aggregation switch's count of core-facing links (and of core switches);
 * the controller's model has as many as a rack has uplinks, a simulated fabric may have fewer.
 */
export function routeThreeTier(
  cluster: Cluster,
  flows: readonly DpFlow[],
  colour: ColourMethod,
  coreLinks = cluster.topology.uplinksPerRack,
): ThreeTierRouting {
  const { racks, uplinksPerRack: links } = cluster.topology;
  const pods = cluster.podCount;
  const podOf = (rack: number) => podOfRack(cluster, rack);
  const inter = flows.map((f) => podOf(f.srcRack) !== podOf(f.dstRack));

  const out = new Int32Array(racks);
  const inn = new Int32Array(racks);
  const leaving = new Int32Array(pods);
  const entering = new Int32Array(pods);
  flows.forEach((f, t) => {
    out[f.srcRack]!++;
    inn[f.dstRack]!++;
    if (inter[t]) {
      leaving[podOf(f.srcRack)]!++;
      entering[podOf(f.dstRack)]!++;
    }
  });
  const perLink = (n: number) => Math.ceil(n / coreLinks);
  // A fold, not Math.max(...): spread arguments overflow the stack past some 65,000 racks.
  const budget = [out, inn, leaving.map(perLink), entering.map(perLink)].reduce((max, counts) => counts.reduce((a, b) => Math.max(a, b), max), 1);
  const copies = (n: number) => Math.ceil(n / budget);

  // Vertex layout: racks first on both sides, then each pod's ingress copies (left) and
  // egress copies (right).
  const ingressBase = prefix(Array.from(entering, copies), racks);
  const egressBase = prefix(Array.from(leaving, copies), racks);
  const from: number[] = [];
  const to: number[] = [];
  const srcEdge = new Int32Array(flows.length);
  const dstEdge = new Int32Array(flows.length);
  const sentSoFar = new Int32Array(pods);
  const receivedSoFar = new Int32Array(pods);
  flows.forEach((f, t) => {
    if (!inter[t]) {
      srcEdge[t] = dstEdge[t] = from.push(f.srcRack) - 1;
      to.push(f.dstRack);
      return;
    }
    const p = podOf(f.srcRack);
    const q = podOf(f.dstRack);
    srcEdge[t] = from.push(f.srcRack) - 1;
    to.push(egressBase.at[p]! + (sentSoFar[p]!++ % copies(leaving[p]!)));
    dstEdge[t] = from.push(ingressBase.at[q]! + (receivedSoFar[q]!++ % copies(entering[q]!))) - 1;
    to.push(f.dstRack);
  });
  const podGraph = { left: ingressBase.end, right: egressBase.end, from, to };
  const podColouring = colour(podGraph);
  const link = foldColours(podGraph, podColouring, links);

  // Step 2: inter-pod flows between aggregation switches, coloured by core switch.
  const crossing = flows.flatMap((_, t) => (inter[t] ? [t] : []));
  const aggregation = pods * links;
  const coreGraph = {
    left: aggregation,
    right: aggregation,
    from: crossing.map((t) => podOf(flows[t]!.srcRack) * links + link[srcEdge[t]!]!),
    to: crossing.map((t) => podOf(flows[t]!.dstRack) * links + link[dstEdge[t]!]!),
  };
  const coreColouring = colour(coreGraph);
  const core = foldColours(coreGraph, coreColouring, coreLinks);
  const coreOf = new Map(crossing.map((t, k) => [t, core[k]!]));

  const paths: DpPath[] = flows.map((_, t) => ({
    colour: podColouring.colours[srcEdge[t]!]!,
    uplink: link[srcEdge[t]!]!,
    downlink: link[dstEdge[t]!]!,
    core: coreOf.get(t) ?? null,
  }));
  return { paths, delta: podColouring.count, coreDelta: coreColouring.count };
}

/** Start offsets of consecutive blocks of the given sizes, beginning at `base`. */
function prefix(sizes: readonly number[], base: number): { at: number[]; end: number } {
  const at: number[] = [];
  let end = base;
  for (const size of sizes) {
    at.push(end);
    end += size;
  }
  return { at, end };
}
