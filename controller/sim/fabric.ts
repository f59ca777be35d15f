import { z } from "zod";
import { MAX_GPUS_PER_HOST, MAX_HOSTS_PER_RACK, MAX_RACKS, MAX_UPLINKS_PER_RACK } from "../../sdk/protocol/limits.ts";

/**
 * A 2-tier Clos as the paper's simulator has it (§7.1): hosts of `gpusPerHost` GPUs, each
 * GPU with its own NIC, under ToRs with `uplinksPerRack` uplinks, one to each spine, every
 * link at the NIC's speed. Oversubscription is hostsPerRack × gpusPerHost : uplinksPerRack.
 */
export const FabricSchema = z.strictObject({
  racks: z.int().min(1).max(MAX_RACKS),
  hostsPerRack: z.int().min(1).max(MAX_HOSTS_PER_RACK),
  gpusPerHost: z.int().min(1).max(MAX_GPUS_PER_HOST),
  uplinksPerRack: z.int().min(1).max(MAX_UPLINKS_PER_RACK),
  /** Speed of every NIC and fabric link. */
  nicGbps: z.number().gt(0).default(400),
});
export type FabricShape = z.infer<typeof FabricSchema>;

export const bytesPerSecond = (gbps: number): number => (gbps * 1e9) / 8;

/**
 * Link numbering: for every host and NIC a link up to the ToR and one down from it, then for
 * every rack and spine the rack's uplink to the spine and the spine's downlink to the rack.
 * `sprayed` makes the full-bisection fabric packet spraying runs on: one aggregate uplink and
 * downlink per rack with the capacity of all its hosts' NICs, since spraying spreads every
 * flow evenly over every spine.
 */
export class Fabric {
  readonly capacities: Float64Array;
  readonly spines: number;
  readonly hostCount: number;
  readonly #hostLinks: number;

  constructor(readonly shape: FabricShape, readonly sprayed = false) {
    const nic = bytesPerSecond(shape.nicGbps);
    this.hostCount = shape.racks * shape.hostsPerRack;
    this.spines = sprayed ? 1 : shape.uplinksPerRack;
    const uplink = sprayed ? nic * shape.hostsPerRack * shape.gpusPerHost : nic;
    this.#hostLinks = 2 * this.hostCount * shape.gpusPerHost;
    this.capacities = new Float64Array(this.#hostLinks + 2 * shape.racks * this.spines);
    this.capacities.fill(nic, 0, this.#hostLinks);
    this.capacities.fill(uplink, this.#hostLinks);
  }

  get nicBytesPerSecond(): number {
    return bytesPerSecond(this.shape.nicGbps);
  }

  rackOf(host: number): number {
    return Math.floor(host / this.shape.hostsPerRack);
  }

  nicUp(host: number, nic: number): number {
    return 2 * (host * this.shape.gpusPerHost + (nic % this.shape.gpusPerHost));
  }

  nicDown(host: number, nic: number): number {
    return this.nicUp(host, nic) + 1;
  }

  uplink(rack: number, spine: number): number {
    return this.#hostLinks + 2 * (rack * this.spines + spine);
  }

  downlink(spine: number, rack: number): number {
    return this.uplink(rack, spine) + 1;
  }

  /** The links of one host-to-host transfer on NIC `nic`, through `spine` when it leaves the rack. */
  path(src: number, dst: number, nic: number, spine: number): number[] {
    const links = [this.nicUp(src, nic), this.nicDown(dst, nic)];
    const from = this.rackOf(src);
    const to = this.rackOf(dst);
    if (from !== to) links.push(this.uplink(from, spine), this.downlink(spine, to));
    return links;
  }
}
