import { z } from "zod";
import type { Tier } from "../planner/route/index.ts";
import { MAX_GPUS_PER_HOST, MAX_HOSTS_PER_RACK, MAX_RACKS, MAX_UPLINKS_PER_RACK } from "../../sdk/contract/protocol/limits.ts";

/**
 * The fabric, every link at the NIC's speed and every GPU with its own NIC. By default a
 * 2-tier Clos as the paper's simulator has it (§7.1): hosts of `gpusPerHost` GPUs under ToRs
 * with `uplinksPerRack` uplinks, one to each spine; oversubscription is hostsPerRack ×
 * gpusPerHost : uplinksPerRack.
 *
 * With `racksPerPod` and `aggUplinks`, a 3-tier Clos (the controller's model, see
 * `route/three-tier.ts`): pods of `racksPerPod` racks, each pod with `uplinksPerRack`
 * aggregation switches (rack uplink i goes to the pod's switch i), each aggregation switch with
 * `aggUplinks` links to the core, link j to core switch j. A pod's core-facing links are
 * uplinksPerRack × aggUplinks.
 *
 * With `uplinksPerRail`, rail-optimised: a "rack" is a pod of hosts under `gpusPerHost` rail
 * switches, rail r connecting GPU (NIC) r of every host in the pod, each rail switch with
 * `uplinksPerRail` uplinks to spines. `uplinksPerRack` must then count the pod's uplinks over
 * all rails (gpusPerHost × uplinksPerRail), the bound MonkeyTree plans racks to.
 */
export const FabricSchema = z
  .strictObject({
    racks: z.int().min(1).max(MAX_RACKS),
    hostsPerRack: z.int().min(1).max(MAX_HOSTS_PER_RACK),
    gpusPerHost: z.int().min(1).max(MAX_GPUS_PER_HOST),
    uplinksPerRack: z.int().min(1).max(MAX_UPLINKS_PER_RACK),
    /** Speed of every NIC and fabric link. */
    nicGbps: z.number().gt(0).default(400),
    /** 3-tier Clos: racks per pod (must divide `racks`). */
    racksPerPod: z.int().min(1).max(MAX_RACKS).optional(),
    /** 3-tier Clos: core-facing links of each aggregation switch. */
    aggUplinks: z.int().min(1).max(MAX_UPLINKS_PER_RACK).optional(),
    /** Rail-optimised: uplinks of each rail switch. */
    uplinksPerRail: z.int().min(1).max(MAX_UPLINKS_PER_RACK).optional(),
  })
  .superRefine((f, ctx) => {
    const issue = (path: string, message: string) => ctx.addIssue({ code: "custom", path: [path], message });
    if ((f.racksPerPod === undefined) !== (f.aggUplinks === undefined))
      issue(f.racksPerPod === undefined ? "racksPerPod" : "aggUplinks", "a 3-tier Clos needs both racksPerPod and aggUplinks");
    if (f.racksPerPod !== undefined && f.racks % f.racksPerPod !== 0)
      issue("racksPerPod", `racksPerPod (${f.racksPerPod}) must divide racks (${f.racks}) so every pod is whole`);
    if (f.uplinksPerRail !== undefined && f.racksPerPod !== undefined)
      issue("uplinksPerRail", "a fabric is either rail-optimised (uplinksPerRail) or a 3-tier Clos (racksPerPod), not both");
    if (f.uplinksPerRail !== undefined && f.uplinksPerRack !== f.gpusPerHost * f.uplinksPerRail) {
      issue(
        "uplinksPerRack",
        `on a rail-optimised fabric uplinksPerRack counts every rail's uplinks: gpusPerHost × uplinksPerRail = ${f.gpusPerHost * f.uplinksPerRail}, got ${f.uplinksPerRack}`,
      );
    }
  });
export type FabricShape = z.infer<typeof FabricSchema>;
export type FabricKind = "clos2" | "clos3" | "rail";

export const fabricKind = (shape: Pick<FabricShape, "racksPerPod" | "uplinksPerRail">): FabricKind =>
  shape.racksPerPod !== undefined ? "clos3" : shape.uplinksPerRail !== undefined ? "rail" : "clos2";

/** What a shape adds to a 2-tier Clos, for table headings: empty for a 2-tier Clos. */
export function fabricSummary(shape: Omit<FabricShape, "nicGbps">): string {
  switch (fabricKind(shape)) {
    case "clos2":
      return "";
    case "clos3": {
      const coreLinks = shape.uplinksPerRack * shape.aggUplinks!;
      return `, 3-tier: ${shape.racks / shape.racksPerPod!} pods of ${shape.racksPerPod} racks, ${coreLinks} core links per pod (${(shape.racksPerPod! * shape.uplinksPerRack) / coreLinks}:1)`;
    }
    case "rail":
      return `, rail-optimised: ${shape.gpusPerHost} rails × ${shape.uplinksPerRail} uplinks per pod of ${shape.hostsPerRack} hosts`;
  }
}

export const bytesPerSecond = (gbps: number): number => (gbps * 1e9) / 8;

/** One ECMP choice on a flow's way: the switch tier that makes it and how many ways it has. */
export interface Hop {
  readonly tier: Tier;
  readonly members: number;
}

const SINGLE: readonly Hop[] = [{ tier: "tor", members: 1 }];

/**
 * Link numbering: for every host and NIC a link up to its ToR (or rail switch) and one down
 * from it; then for every rack and rack-level uplink t (spine t; aggregation switch t; rail
 * t ÷ uplinksPerRail's uplink t mod uplinksPerRail) the uplink and its downlink; then, in a
 * 3-tier Clos, for every pod, aggregation switch and core link its up and down direction.
 *
 * A flow between racks is routed by its choices, one per hop (`hops`), each picking among the
 * members of one ECMP group. `sprayed` makes the full-bisection fabric packet spraying runs
 * on, whatever the shape: one aggregate uplink and downlink per rack with the capacity of all
 * its hosts' NICs, since spraying spreads every flow evenly over every path.
 */
export class Fabric {
  readonly capacities: Float64Array;
  readonly kind: FabricKind;
  readonly hostCount: number;
  /** Rack-level uplinks per rack. */
  readonly #rackLinks: number;
  readonly #hostLinks: number;
  readonly #coreBase: number;
  readonly #hops: { local: readonly Hop[]; remote: readonly Hop[] };

  constructor(
    readonly shape: FabricShape,
    readonly sprayed = false,
  ) {
    const nic = bytesPerSecond(shape.nicGbps);
    this.kind = sprayed ? "clos2" : fabricKind(shape);
    this.hostCount = shape.racks * shape.hostsPerRack;
    this.#rackLinks = sprayed ? 1 : this.kind === "rail" ? shape.gpusPerHost * shape.uplinksPerRail! : shape.uplinksPerRack;
    const uplink = sprayed ? nic * shape.hostsPerRack * shape.gpusPerHost : nic;
    this.#hostLinks = 2 * this.hostCount * shape.gpusPerHost;
    this.#coreBase = this.#hostLinks + 2 * shape.racks * this.#rackLinks;
    const coreLinks = this.kind === "clos3" ? 2 * (shape.racks / shape.racksPerPod!) * shape.uplinksPerRack * shape.aggUplinks! : 0;
    this.capacities = new Float64Array(this.#coreBase + coreLinks);
    this.capacities.fill(nic, 0, this.#hostLinks);
    this.capacities.fill(uplink, this.#hostLinks, this.#coreBase);
    this.capacities.fill(nic, this.#coreBase);
    const tor: Hop = { tier: "tor", members: this.kind === "rail" ? shape.uplinksPerRail! : this.#rackLinks };
    this.#hops = {
      local: sprayed ? SINGLE : [tor],
      remote: sprayed
        ? SINGLE
        : this.kind === "clos3"
          ? [tor, { tier: "aggregation", members: shape.aggUplinks! }, { tier: "core", members: shape.uplinksPerRack }]
          : [tor],
    };
  }

  get nicBytesPerSecond(): number {
    return bytesPerSecond(this.shape.nicGbps);
  }

  rackOf(host: number): number {
    return Math.floor(host / this.shape.hostsPerRack);
  }

  podOf(rack: number): number {
    return this.kind === "clos3" ? Math.floor(rack / this.shape.racksPerPod!) : rack;
  }

  nicUp(host: number, nic: number): number {
    return 2 * (host * this.shape.gpusPerHost + (nic % this.shape.gpusPerHost));
  }

  nicDown(host: number, nic: number): number {
    return this.nicUp(host, nic) + 1;
  }

  /** Rack `rack`'s uplink `link` (in a rail-optimised fabric, rail ⌊link ÷ uplinksPerRail⌋'s). */
  uplink(rack: number, link: number): number {
    return this.#hostLinks + 2 * (rack * this.#rackLinks + link);
  }

  downlink(link: number, rack: number): number {
    return this.uplink(rack, link) + 1;
  }

  /** Aggregation switch `agg` of `pod` to core switch `core`. */
  coreUplink(pod: number, agg: number, core: number): number {
    return this.#coreBase + 2 * ((pod * this.shape.uplinksPerRack + agg) * this.shape.aggUplinks! + core);
  }

  coreDownlink(core: number, pod: number, agg: number): number {
    return this.coreUplink(pod, agg, core) + 1;
  }

  /** The ECMP choices a flow from rack `src` to rack `dst` makes; none inside a rack. */
  hops(src: number, dst: number): readonly Hop[] {
    if (src === dst) return [];
    return this.podOf(src) === this.podOf(dst) ? this.#hops.local : this.#hops.remote;
  }

  /**
   * The links that choice `choices[hop]` adds, given the choices before it: written to `into`
   * from its start, returning how many (one or two); `rail` is the NIC (and so the rail) the
   * flow leaves on, which only a rail-optimised fabric looks at.
   */
  hopLinks(src: number, dst: number, rail: number, choices: readonly number[], hop: number, into: number[]): number {
    const c = choices[hop]!;
    if (this.kind === "rail") {
      const link = (rail % this.shape.gpusPerHost) * this.shape.uplinksPerRail! + c;
      return this.#pair(into, this.uplink(src, link), this.downlink(link, dst));
    }
    if (this.kind === "clos2" || this.podOf(src) === this.podOf(dst)) return this.#pair(into, this.uplink(src, c), this.downlink(c, dst));
    if (hop === 2) return this.#pair(into, this.coreDownlink(choices[1]!, this.podOf(dst), c), this.downlink(c, dst));
    into[0] = hop === 0 ? this.uplink(src, c) : this.coreUplink(this.podOf(src), choices[0]!, c);
    return 1;
  }

  #pair(into: number[], a: number, b: number): 2 {
    into[0] = a;
    into[1] = b;
    return 2;
  }

  /** Every fabric link (above the NICs) of a flow between racks that made `choices`. */
  route(src: number, dst: number, rail: number, choices: readonly number[]): number[] {
    const links: number[] = [];
    const hop: number[] = [];
    for (let h = 0; h < choices.length; h++) {
      const n = this.hopLinks(src, dst, rail, choices, h, hop);
      for (let i = 0; i < n; i++) links.push(hop[i]!);
    }
    return links;
  }

  /** The links of one host-to-host transfer on NIC `nic` with the given choices when it leaves the rack. */
  path(src: number, dst: number, nic: number, choices: readonly number[]): number[] {
    return [this.nicUp(src, nic), this.nicDown(dst, nic), ...this.route(this.rackOf(src), this.rackOf(dst), nic, choices)];
  }
}
