import type { Cluster } from "../model/cluster.ts";
import { colourEdges, crc32HashModel, defaultAddressOf, EPHEMERAL_PORTS, ROCE_V2_PORT, routeCluster, type DpFlow, type PpFlow, type Tier } from "../route/index.ts";
import { routePipelineFlows } from "../route/paths.ts";
import { routeThreeTier } from "../route/three-tier.ts";
import { routeTwoTier } from "../route/two-tier.ts";
import type { Fabric } from "./fabric.ts";

/** How a system picks the path of each cross-rack flow. */
export const ROUTINGS = ["ecmp", "perfect", "crux", "sglb", "spray"] as const;
export type RoutingName = (typeof ROUTINGS)[number];

export interface RoutingContext {
  readonly fabric: Fabric;
  readonly seed: number;
  /** Crux's job intensity: GPU time its communication holds up per byte, higher first. */
  readonly intensity: (job: string) => number;
  /** SGLB's choice set: each flow takes one of the K least-loaded spines. */
  readonly sglbK: number;
}

/**
 * A cross-rack flow as the routings see it: its racks, its rail, and the name its hash draws
 * from. Given as such, it is one no controller routes (an expert-parallel all-to-all's):
 * hosts send it where their switches' default ECMP hash does, unless the system balances load
 * itself.
 */
export interface OtherFlow {
  readonly srcHost: number;
  readonly dstHost: number;
  readonly srcRack: number;
  readonly dstRack: number;
  /** The NIC it leaves on, which is its rail in a rail-optimised fabric. */
  readonly nic: number;
  readonly key: string;
}

/**
 * For every DP, PP and other flow, in the order given, its choice at each hop of
 * `Fabric.hops` (the spine in a 2-tier Clos; aggregation switch, core switch and destination
 * aggregation switch between pods of a 3-tier one; the rail's uplink in a rail-optimised one).
 */
export interface PathChoice {
  readonly dp: number[][];
  readonly pp: number[][];
  readonly other: number[][];
}

const UDP = 17;
const hashModel = crc32HashModel();

/** FNV-1a of a string, mixed with a seed: the stand-in for how a NIC picks a queue pair's port. */
export function flowHash(key: string, seed: number): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/** The ephemeral source port a flow's queue pair draws. */
export function sourcePort(key: string, seed: number): number {
  const span = EPHEMERAL_PORTS.last - EPHEMERAL_PORTS.first + 1;
  return EPHEMERAL_PORTS.first + (flowHash(key, seed) % span);
}

/**
 * The spine a ToR's ECMP hash sends a flow to: CRC-32 of the RoCEv2 5-tuple (the switch
 * model routing steers against), with a source port the flow's queue pair drew at random.
 */
export function ecmpSpine(srcHost: number, dstHost: number, key: string, seed: number, spines: number, tier: Tier = "tor"): number {
  const tuple = { srcAddress: defaultAddressOf(srcHost), dstAddress: defaultAddressOf(dstHost), protocol: UDP, srcPort: sourcePort(key, seed), dstPort: ROCE_V2_PORT };
  return hashModel.select(tuple, spines, tier);
}

/** Every hop's ECMP choice for a flow, each switch tier hashing the same 5-tuple its own way. */
export function ecmpChoices(fabric: Fabric, f: { srcHost: number; dstHost: number }, key: string, seed: number): number[] {
  return fabric.hops(fabric.rackOf(f.srcHost), fabric.rackOf(f.dstHost)).map((hop) => ecmpSpine(f.srcHost, f.dstHost, key, seed, hop.members, hop.tier));
}

/**
 * The rail a DP ring runs on in a rail-optimised fabric: rail-aligned ranks keep ring k of a
 * TP job on NIC k of every host, so a job with a ring per NIC uses every rail once; a job with
 * fewer rings (DP/FSDP) starts at a rail drawn from its group's name, spreading such jobs.
 */
export function ringRail(cluster: Cluster, f: DpFlow, nics: number): number {
  const g = cluster.groups[f.group]!;
  return g.rings >= nics ? f.ring % nics : (f.ring + flowHash(`${g.job}/${g.index}`, 0)) % nics;
}

export const dpKey = (cluster: Cluster, f: DpFlow): string => {
  const g = cluster.groups[f.group]!;
  return `${g.job}/${g.index}/${f.ring}/${f.srcHost}>${f.dstHost}`;
};
export const ppKey = (cluster: Cluster, f: PpFlow): string => {
  const from = cluster.groups[f.fromGroup]!;
  const to = cluster.groups[f.toGroup]!;
  return `${from.job}/${from.index}>${to.index}/${f.replica}/${f.srcHost}>${f.dstHost}`;
};

export function choosePaths(
  name: RoutingName,
  cluster: Cluster,
  dp: readonly DpFlow[],
  pp: readonly PpFlow[],
  other: readonly OtherFlow[],
  context: RoutingContext,
): PathChoice {
  const nics = cluster.topology.gpusPerHost;
  const dpFlows = dp.map((f) => ({ ...f, nic: ringRail(cluster, f, nics), key: dpKey(cluster, f) }));
  const ppFlows = pp.map((f) => ({ ...f, nic: f.replica % nics, key: ppKey(cluster, f) }));
  const hashed = (flows: readonly OtherFlow[]) => flows.map((f) => ecmpChoices(context.fabric, f, f.key, context.seed));
  switch (name) {
    case "spray":
      return { dp: dp.map(() => [0]), pp: pp.map(() => [0]), other: other.map(() => [0]) };
    case "ecmp":
      return { dp: hashed(dpFlows), pp: hashed(ppFlows), other: hashed(other) };
    case "perfect":
      return { ...perfect(cluster, dp, pp, dpFlows, context.fabric), other: hashed(other) };
    case "crux":
      return crux(cluster, dpFlows, ppFlows, other, context);
    case "sglb":
      return sglb(dpFlows, ppFlows, other, context);
  }
}

/**
 * The controller's routing. In a 2-tier Clos, as `monkeytree routes` computes it for the
 * cluster's ring orders. In a 3-tier one, its two-step colouring (`route/three-tier.ts`: each
 * pod with a virtual endpoint for inter-pod flows, then aggregation to core) with the
 * aggregation switches' real core-link count, and its round-robin pipeline routes. In a
 * rail-optimised one, rails share no links, so each rail is its own 2-tier Clos with
 * `uplinksPerRail` spines: the controller's 2-tier colouring on that rail's rings, and
 * pipeline flows round-robin over the rail's uplinks.
 */
function perfect(cluster: Cluster, dp: readonly DpFlow[], pp: readonly PpFlow[], dpFlows: readonly OtherFlow[], fabric: Fabric): Omit<PathChoice, "other"> {
  const shape = fabric.shape;
  if (fabric.kind === "clos3") {
    const routed = routeThreeTier(cluster, dp, colourEdges, shape.aggUplinks!).paths;
    const hops = (p: { uplink: number; core: number | null; downlink: number }) => (p.core === null ? [p.uplink] : [p.uplink, p.core % shape.aggUplinks!, p.downlink]);
    return { dp: routed.map(hops), pp: routePipelineFlows(cluster, pp).map(hops) };
  }
  if (fabric.kind === "rail") {
    const rail = { ...cluster, topology: { ...cluster.topology, uplinksPerRack: shape.uplinksPerRail! } };
    const choice: number[][] = dp.map(() => []);
    for (let r = 0; r < shape.gpusPerHost; r++) {
      const on = dp.flatMap((_, i) => (dpFlows[i]!.nic === r ? [i] : []));
      routeTwoTier(rail, on.map((i) => dp[i]!), colourEdges).paths.forEach((p, k) => (choice[on[k]!] = [p.uplink]));
    }
    return { dp: choice, pp: routePipelineFlows(rail, pp).map((p) => [p.uplink]) };
  }
  const routes = routeCluster(cluster, { previousOrders: cluster.placement });
  const same = (a: { srcHost: number; dstHost: number }, b: { srcHost: number; dstHost: number } | undefined) => b !== undefined && a.srcHost === b.srcHost && a.dstHost === b.dstHost;
  if (routes.dpFlows.length !== dp.length || !dp.every((f, i) => same(f, routes.dpFlows[i]))) {
    throw new Error("Perfect routing saw other DP flows than the simulator: groups must be kept in ring order");
  }
  if (routes.ppFlows.length !== pp.length || !pp.every((f, i) => same(f, routes.ppFlows[i]))) {
    throw new Error("Perfect routing saw other PP flows than the simulator: groups must be kept in ring order");
  }
  return { dp: routes.dpFlows.map((r) => [r.uplink]), pp: routes.ppFlows.map((r) => [r.uplink]) };
}

/**
 * Flows counted on every fabric link, as a greedy router places them hop by hop: at each
 * switch a flow's candidates are ranked by the busiest link that choice adds.
 */
class LinkLoads {
  readonly #load: Int32Array;
  constructor(readonly fabric: Fabric) {
    this.#load = new Int32Array(fabric.capacities.length);
  }
  /** Each hop's members by load, least loaded first, lower index on ties. */
  #ranked(f: OtherFlow, choices: number[], hop: number, members: number): number[] {
    const load = Array.from({ length: members }, (_, c) => {
      choices[hop] = c;
      return this.fabric.hopLinks(f.srcRack, f.dstRack, f.nic, choices, hop).reduce((max, link) => Math.max(max, this.#load[link]!), 0);
    });
    return Array.from({ length: members }, (_, c) => c).sort((a, b) => load[a]! - load[b]! || a - b);
  }
  /** Picks every hop in turn with `pick` from the ranked members, and counts the flow on its links. */
  place(f: OtherFlow, pick: (ranked: number[], hop: number) => number): number[] {
    const choices: number[] = [];
    this.fabric.hops(f.srcRack, f.dstRack).forEach((h, hop) => (choices[hop] = pick(this.#ranked(f, choices, hop, h.members), hop)));
    for (const link of this.fabric.route(f.srcRack, f.dstRack, f.nic, choices)) this.#load[link]!++;
    return choices;
  }
}

/**
 * Crux: jobs in decreasing intensity, each job's flows in turn on the least-loaded path, hop by
 * hop. Greedy, so it can miss an isolating assignment that exists. PP and other flows follow,
 * spread the same way.
 */
function crux(cluster: Cluster, dp: readonly (OtherFlow & Pick<DpFlow, "group">)[], pp: readonly OtherFlow[], other: readonly OtherFlow[], context: RoutingContext): PathChoice {
  const loads = new LinkLoads(context.fabric);
  const jobOf = (i: number) => cluster.groups[dp[i]!.group]!.job;
  const order = dp.map((_, i) => i).sort((a, b) => {
    const ja = jobOf(a);
    const jb = jobOf(b);
    return context.intensity(jb) - context.intensity(ja) || (ja < jb ? -1 : ja > jb ? 1 : 0) || a - b;
  });
  const least = (f: OtherFlow) => loads.place(f, (ranked) => ranked[0]!);
  const dpChoices: number[][] = dp.map(() => []);
  for (const i of order) dpChoices[i] = least(dp[i]!);
  return { dp: dpChoices, pp: pp.map(least), other: other.map(least) };
}

/**
 * SGLB at flow level: each switch on the way steers the flow to one of the K members that are
 * least loaded when it is placed, which one drawn from the flow's hash, since switches act on
 * local, slightly stale signals rather than a global assignment.
 */
function sglb(dp: readonly OtherFlow[], pp: readonly OtherFlow[], other: readonly OtherFlow[], context: RoutingContext): PathChoice {
  const loads = new LinkLoads(context.fabric);
  const place = (f: OtherFlow) =>
    loads.place(f, (ranked, hop) => {
      const candidates = ranked.slice(0, Math.max(1, context.sglbK));
      return candidates[flowHash(hop === 0 ? f.key : `${f.key}#${hop}`, context.seed) % candidates.length]!;
    });
  return { dp: dp.map(place), pp: pp.map(place), other: other.map(place) };
}
