import type { Cluster } from "../model/cluster.ts";
import { crc32HashModel, defaultAddressOf, EPHEMERAL_PORTS, ROCE_V2_PORT, routeCluster, type DpFlow, type PpFlow } from "../route/index.ts";

/** How a system picks the spine of each cross-rack flow. */
export const ROUTINGS = ["ecmp", "perfect", "crux", "sglb", "spray"] as const;
export type RoutingName = (typeof ROUTINGS)[number];

export interface RoutingContext {
  readonly spines: number;
  readonly seed: number;
  /** Crux's job intensity: GPU time its communication holds up per byte, higher first. */
  readonly intensity: (job: string) => number;
  /** SGLB's choice set: each flow takes one of the K least-loaded spines. */
  readonly sglbK: number;
}

/**
 * A cross-rack flow no controller routes (an expert-parallel all-to-all's): hosts send it
 * where their switches' default ECMP hash does, unless the system balances load itself.
 */
export interface OtherFlow {
  readonly srcHost: number;
  readonly dstHost: number;
  readonly srcRack: number;
  readonly dstRack: number;
  readonly key: string;
}

/** A spine for every DP, PP and other flow, in the order given. */
export interface SpineChoice {
  readonly dp: number[];
  readonly pp: number[];
  readonly other: number[];
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
export function ecmpSpine(srcHost: number, dstHost: number, key: string, seed: number, spines: number): number {
  const tuple = { srcAddress: defaultAddressOf(srcHost), dstAddress: defaultAddressOf(dstHost), protocol: UDP, srcPort: sourcePort(key, seed), dstPort: ROCE_V2_PORT };
  return hashModel.select(tuple, spines, "tor");
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

export function chooseSpines(
  name: RoutingName,
  cluster: Cluster,
  dp: readonly DpFlow[],
  pp: readonly PpFlow[],
  other: readonly OtherFlow[],
  context: RoutingContext,
): SpineChoice {
  const hashed = (flows: readonly OtherFlow[]) => flows.map((f) => ecmpSpine(f.srcHost, f.dstHost, f.key, context.seed, context.spines));
  switch (name) {
    case "spray":
      return { dp: dp.map(() => 0), pp: pp.map(() => 0), other: other.map(() => 0) };
    case "ecmp":
      return {
        dp: dp.map((f) => ecmpSpine(f.srcHost, f.dstHost, dpKey(cluster, f), context.seed, context.spines)),
        pp: pp.map((f) => ecmpSpine(f.srcHost, f.dstHost, ppKey(cluster, f), context.seed, context.spines)),
        other: hashed(other),
      };
    case "perfect":
      return { ...perfect(cluster, dp, pp), other: hashed(other) };
    case "crux":
      return crux(cluster, dp, pp, other, context);
    case "sglb":
      return sglb(cluster, dp, pp, other, context);
  }
}

/** The controller's routing, as `monkeytree routes` computes it for the cluster's ring orders. */
function perfect(cluster: Cluster, dp: readonly DpFlow[], pp: readonly PpFlow[]): Omit<SpineChoice, "other"> {
  const routes = routeCluster(cluster, { previousOrders: cluster.placement });
  const same = (a: { srcHost: number; dstHost: number }, b: { srcHost: number; dstHost: number } | undefined) => b !== undefined && a.srcHost === b.srcHost && a.dstHost === b.dstHost;
  if (routes.dpFlows.length !== dp.length || !dp.every((f, i) => same(f, routes.dpFlows[i]))) {
    throw new Error("Perfect routing saw other DP flows than the simulator: groups must be kept in ring order");
  }
  if (routes.ppFlows.length !== pp.length || !pp.every((f, i) => same(f, routes.ppFlows[i]))) {
    throw new Error("Perfect routing saw other PP flows than the simulator: groups must be kept in ring order");
  }
  return { dp: routes.dpFlows.map((r) => r.uplink), pp: routes.ppFlows.map((r) => r.uplink) };
}

/** Flows counted on every rack's uplinks and downlinks, per spine, as a greedy router places them. */
class SpineLoads {
  readonly #up: Int32Array;
  readonly #down: Int32Array;
  constructor(racks: number, readonly spines: number) {
    this.#up = new Int32Array(racks * spines);
    this.#down = new Int32Array(racks * spines);
  }
  load(src: number, dst: number, spine: number): number {
    return Math.max(this.#up[src * this.spines + spine]!, this.#down[dst * this.spines + spine]!);
  }
  add(src: number, dst: number, spine: number): void {
    this.#up[src * this.spines + spine]!++;
    this.#down[dst * this.spines + spine]!++;
  }
  /** Spines by load, least loaded first, lower index on ties. */
  ranked(src: number, dst: number): number[] {
    return Array.from({ length: this.spines }, (_, s) => s).sort((a, b) => this.load(src, dst, a) - this.load(src, dst, b) || a - b);
  }
}

/**
 * Crux: jobs in decreasing intensity, each job's flows in turn on the spine whose busier end
 * carries the fewest flows so far. Greedy, so it can miss an isolating assignment that
 * exists. PP and other flows follow, spread the same way.
 */
function crux(cluster: Cluster, dp: readonly DpFlow[], pp: readonly PpFlow[], other: readonly OtherFlow[], context: RoutingContext): SpineChoice {
  const loads = new SpineLoads(cluster.topology.racks, context.spines);
  const jobOf = (g: number) => cluster.groups[g]!.job;
  const order = dp.map((_, i) => i).sort((a, b) => {
    const ja = jobOf(dp[a]!.group);
    const jb = jobOf(dp[b]!.group);
    return context.intensity(jb) - context.intensity(ja) || (ja < jb ? -1 : ja > jb ? 1 : 0) || a - b;
  });
  const dpSpines = new Array<number>(dp.length).fill(0);
  for (const i of order) {
    const f = dp[i]!;
    const spine = loads.ranked(f.srcRack, f.dstRack)[0]!;
    loads.add(f.srcRack, f.dstRack, spine);
    dpSpines[i] = spine;
  }
  const least = (f: { srcRack: number; dstRack: number }) => {
    const spine = loads.ranked(f.srcRack, f.dstRack)[0]!;
    loads.add(f.srcRack, f.dstRack, spine);
    return spine;
  };
  const ppSpines = pp.map(least);
  return { dp: dpSpines, pp: ppSpines, other: other.map(least) };
}

/**
 * SGLB at flow level: switches steer each flow to one of the K spines that are least loaded
 * when it is placed, which one drawn from the flow's hash, since they act on local, slightly
 * stale signals rather than a global assignment.
 */
function sglb(cluster: Cluster, dp: readonly DpFlow[], pp: readonly PpFlow[], other: readonly OtherFlow[], context: RoutingContext): SpineChoice {
  const loads = new SpineLoads(cluster.topology.racks, context.spines);
  const place = (src: number, dst: number, key: string) => {
    const candidates = loads.ranked(src, dst).slice(0, Math.max(1, context.sglbK));
    const spine = candidates[flowHash(key, context.seed) % candidates.length]!;
    loads.add(src, dst, spine);
    return spine;
  };
  return {
    dp: dp.map((f) => place(f.srcRack, f.dstRack, dpKey(cluster, f))),
    pp: pp.map((f) => place(f.srcRack, f.dstRack, ppKey(cluster, f))),
    other: other.map((f) => place(f.srcRack, f.dstRack, f.key)),
  };
}
