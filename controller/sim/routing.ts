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
  /** SGLB's choice set: each flow takes one of the K spines that offer it the most. */
  readonly sglbK: number;
  /** The share of a link each of a job's DP and PP flows fills at most: its demand over the link's speed. */
  readonly share: (job: string) => { readonly dp: number; readonly pp: number };
}

/**
 * A cross-rack flow outside the DP rings and pipelines (an expert-parallel all-to-all's): ECMP
 * hashes it, Perfect routing spreads it round-robin, Crux and SGLB place it by load.
 */
export interface OtherFlow {
  readonly srcHost: number;
  readonly dstHost: number;
  readonly srcRack: number;
  readonly dstRack: number;
  readonly key: string;
  /** The share of a link it fills at most: its demand over the link's speed, in (0, 1]. */
  readonly share: number;
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
      return { ...perfect(cluster, dp, pp), other: roundRobin(other, context.spines) };
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

/**
 * Perfect routing's way with flows it does not isolate (paper §5.4: other flows are spread
 * "round-robin across available spines"), as it spreads pipeline flows: each source rack
 * hands its flows to its uplinks in turn.
 */
function roundRobin(flows: readonly OtherFlow[], spines: number): number[] {
  const next = new Map<number, number>();
  return flows.map((f) => {
    const n = next.get(f.srcRack) ?? 0;
    next.set(f.srcRack, n + 1);
    return n % spines;
  });
}

/**
 * Load on every rack's uplinks and downlinks, per spine, as a greedy router places flows: the
 * flows on each link, and the share of it they want (their demands over its speed: a DP ring
 * all of it, an all-to-all sub-flow of n hosts 1/(n − 1), a ring that carries nothing none).
 * A new flow goes where max-min fairness would give it the most: the spare capacity of a link
 * that is not full, an equal share of one that is, up to what it wants; on ties, where less is
 * wanted already. Counting flows alone would put a ring beside mice that fit elsewhere;
 * counting shares alone would pile mice onto a full link, where each takes as much as a ring.
 */
class SpineLoads {
  readonly #wanted: Float64Array;
  readonly #flows: Float64Array;
  constructor(racks: number, readonly spines: number) {
    // Uplinks first, then downlinks, per rack and spine.
    this.#wanted = new Float64Array(2 * racks * spines);
    this.#flows = new Float64Array(2 * racks * spines);
  }
  #links(src: number, dst: number, spine: number): [number, number] {
    return [src * this.spines + spine, this.#wanted.length / 2 + dst * this.spines + spine];
  }
  add(src: number, dst: number, spine: number, share: number): void {
    for (const l of this.#links(src, dst, spine)) {
      this.#wanted[l]! += share;
      if (share > 0) this.#flows[l]!++;
    }
  }
  /** The `k` best spines for a flow wanting `share`, best first, lower index on ties. */
  best(src: number, dst: number, k: number, share: number): number[] {
    const picked: number[] = [];
    // Per picked spine: what the flow would get there, and what its links already carry.
    const rates: number[] = [];
    const wanted: number[] = [];
    const up = src * this.spines;
    const down = this.#wanted.length / 2 + dst * this.spines;
    const beats = (rate: number, carried: number, i: number) => rate > rates[i]! || (rate === rates[i]! && carried < wanted[i]!);
    for (let s = 0; s < this.spines; s++) {
      const wantedUp = this.#wanted[up + s]!;
      const wantedDown = this.#wanted[down + s]!;
      const rate = Math.min(share, Math.max(1 - wantedUp, 1 / (this.#flows[up + s]! + 1)), Math.max(1 - wantedDown, 1 / (this.#flows[down + s]! + 1)));
      const carried = Math.max(wantedUp, wantedDown);
      if (picked.length === k) {
        if (!beats(rate, carried, k - 1)) continue;
        picked.pop();
        rates.pop();
        wanted.pop();
      }
      let i = picked.length;
      while (i > 0 && beats(rate, carried, i - 1)) i--;
      picked.splice(i, 0, s);
      rates.splice(i, 0, rate);
      wanted.splice(i, 0, carried);
    }
    return picked;
  }
}

/**
 * Crux: jobs in decreasing intensity, each job's flows in turn on the spine that offers it the
 * most so far (see SpineLoads). Greedy, so it can miss an isolating assignment that exists.
 * PP and other flows follow, spread the same way.
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
    const share = dpShare(cluster, f, context);
    const spine = loads.best(f.srcRack, f.dstRack, 1, share)[0]!;
    loads.add(f.srcRack, f.dstRack, spine, share);
    dpSpines[i] = spine;
  }
  const least = (f: { srcRack: number; dstRack: number }, share: number) => {
    const spine = loads.best(f.srcRack, f.dstRack, 1, share)[0]!;
    loads.add(f.srcRack, f.dstRack, spine, share);
    return spine;
  };
  const ppSpines = pp.map((f) => least(f, ppShare(cluster, f, context)));
  return { dp: dpSpines, pp: ppSpines, other: other.map((f) => least(f, f.share)) };
}

/**
 * SGLB at flow level: switches steer each flow to one of the K spines that offer it the most
 * when it is placed (see SpineLoads), which one drawn from the flow's hash, since they act on local, slightly
 * stale signals rather than a global assignment.
 */
function sglb(cluster: Cluster, dp: readonly DpFlow[], pp: readonly PpFlow[], other: readonly OtherFlow[], context: RoutingContext): SpineChoice {
  const loads = new SpineLoads(cluster.topology.racks, context.spines);
  const place = (src: number, dst: number, key: string, share: number) => {
    const candidates = loads.best(src, dst, Math.max(1, context.sglbK), share);
    const spine = candidates[flowHash(key, context.seed) % candidates.length]!;
    loads.add(src, dst, spine, share);
    return spine;
  };
  return {
    dp: dp.map((f) => place(f.srcRack, f.dstRack, dpKey(cluster, f), dpShare(cluster, f, context))),
    pp: pp.map((f) => place(f.srcRack, f.dstRack, ppKey(cluster, f), ppShare(cluster, f, context))),
    other: other.map((f) => place(f.srcRack, f.dstRack, f.key, f.share)),
  };
}

const dpShare = (cluster: Cluster, f: DpFlow, context: RoutingContext): number => context.share(cluster.groups[f.group]!.job).dp;
const ppShare = (cluster: Cluster, f: PpFlow, context: RoutingContext): number => context.share(cluster.groups[f.fromGroup]!.job).pp;
