/**
 * ECMP steering: a host daemon pins a RoCEv2 flow to its assigned path by choosing the UDP
 * source port of its queue pair, since switches pick among equal-cost next hops by hashing
 * the 5-tuple and the rest of the tuple is fixed (addresses, UDP, destination port 4791).
 *
 * The switch side is a `SwitchHashModel`. The default models every tier as CRC-32 over the
 * 13-byte tuple modulo the number of next hops, with a different CRC polynomial per tier:
 * operators configure tiers differently so that choices are not correlated hop to hop (hash
 * polarization). For CRC hashes the polynomial must differ — another initial value only XORs
 * the result with a constant, so with a power-of-two fan-out the core-facing choice would
 * still be fixed by the rack uplink and most inter-pod paths could not be steered. A
 * deployment plugs in its switches' real model (field selection, seed, polynomial, how the
 * hash maps to an ECMP member) by implementing `SwitchHashModel` and passing it to
 * `routeCluster`.
 */

export const ROCE_V2_PORT = 4791;
export const UDP = 17;
/** The IANA dynamic/ephemeral range the source port is chosen from. */
export const EPHEMERAL_PORTS = { first: 49152, last: 65535 } as const;

export interface FiveTuple {
  /** IPv4 address as an unsigned 32-bit number. */
  readonly srcAddress: number;
  readonly dstAddress: number;
  readonly protocol: number;
  readonly srcPort: number;
  readonly dstPort: number;
}

/** Switch tiers that make an ECMP choice on a DP path. */
export type Tier = "tor" | "aggregation" | "core";

export interface SwitchHashModel {
  readonly name: string;
  /** The next hop, in `0 … members-1`, a switch of `tier` picks for this tuple. */
  select(tuple: FiveTuple, members: number, tier: Tier): number;
  /**
   * Optional fast form of `select` for one flow: the next hop as a function of the source
   * port alone, the rest of `tuple` fixed. Steering tries thousands of ports per flow, so a
   * model that can precompute per flow should.
   */
  bySourcePort?(tuple: Omit<FiveTuple, "srcPort">, members: number, tier: Tier): (srcPort: number) => number;
}

/** `model.bySourcePort`, or the same through `select` for models without a fast form. */
export function hopBySourcePort(model: SwitchHashModel, tuple: Omit<FiveTuple, "srcPort">, members: number, tier: Tier): (srcPort: number) => number {
  if (model.bySourcePort) return model.bySourcePort(tuple, members, tier);
  const full = { ...tuple, srcPort: 0 };
  return (srcPort) => {
    full.srcPort = srcPort;
    return model.select(full, members, tier);
  };
}

/** One ECMP decision a flow must come out of with `member`. */
export interface HashHop {
  readonly tier: Tier;
  readonly members: number;
  readonly member: number;
}

export interface SteerRequest {
  readonly srcAddress: number;
  readonly dstAddress: number;
  readonly hops: readonly HashHop[];
}

const POLYNOMIALS: Record<Tier, number> = {
  tor: 0xedb88320, // CRC-32 (IEEE 802.3)
  aggregation: 0x82f63b78, // CRC-32C (Castagnoli)
  core: 0xeb31d82e, // CRC-32K (Koopman)
};

function crcTable(polynomial: number): Uint32Array {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? polynomial ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
}

const TABLES: Record<Tier, Uint32Array> = {
  tor: crcTable(POLYNOMIALS.tor),
  aggregation: crcTable(POLYNOMIALS.aggregation),
  core: crcTable(POLYNOMIALS.core),
};

/** Reflected CRC-32 of `bytes` with the given tier's polynomial (the tor tier is standard CRC-32). */
export function crc32(bytes: Uint8Array, tier: Tier = "tor"): number {
  return (crcUpdate(0xffffffff, bytes, 0, bytes.length, TABLES[tier]) ^ 0xffffffff) >>> 0;
}

function crcUpdate(state: number, bytes: Uint8Array, from: number, to: number, table: Uint32Array): number {
  let c = state;
  for (let i = from; i < to; i++) c = table[(c ^ bytes[i]!) & 0xff]! ^ (c >>> 8);
  return c;
}

/** Source address, destination address, protocol, source port, destination port, big-endian. */
export function tupleBytes(tuple: FiveTuple, into = new Uint8Array(13)): Uint8Array {
  const words = [tuple.srcAddress, tuple.dstAddress];
  words.forEach((word, w) => {
    for (let b = 0; b < 4; b++) into[w * 4 + b] = (word >>> (24 - 8 * b)) & 0xff;
  });
  into[8] = tuple.protocol & 0xff;
  into[9] = (tuple.srcPort >>> 8) & 0xff;
  into[10] = tuple.srcPort & 0xff;
  into[11] = (tuple.dstPort >>> 8) & 0xff;
  into[12] = tuple.dstPort & 0xff;
  return into;
}

export function crc32HashModel(): SwitchHashModel {
  const model: SwitchHashModel = {
    name: "crc32-5tuple-mod (tor CRC-32, aggregation CRC-32C, core CRC-32K)",
    select: (tuple, members, tier) => model.bySourcePort!(tuple, members, tier)(tuple.srcPort),
    bySourcePort: (tuple, members, tier) => {
      // A CRC register step is linear in (register, byte), so the CRC of the tuple is the CRC
      // with a zero source port XOR a term that depends on the port alone: one XOR per port.
      const table = TABLES[tier];
      const bytes = tupleBytes({ ...tuple, srcPort: 0 });
      const fixed = (crcUpdate(0xffffffff, bytes, 0, 13, table) ^ 0xffffffff) >>> 0;
      const terms = portTerms(tier);
      return (srcPort) => ((fixed ^ terms[srcPort & 0xffff]!) >>> 0) % members;
    },
  };
  return model;
}

const PORT_TERMS = new Map<Tier, Uint32Array>();

/** Per tier, the CRC contribution of each source port (bytes 9–10 of the tuple), from a zero register. */
function portTerms(tier: Tier): Uint32Array {
  let terms = PORT_TERMS.get(tier);
  if (terms) return terms;
  const table = TABLES[tier];
  const bytes = new Uint8Array(13);
  terms = new Uint32Array(65536);
  for (let port = 0; port < 65536; port++) {
    bytes[9] = port >>> 8;
    bytes[10] = port & 0xff;
    terms[port] = crcUpdate(0, bytes, 9, 13, table) >>> 0;
  }
  PORT_TERMS.set(tier, terms);
  return terms;
}

/** Default addressing when the caller has none: host h is 10.0.0.0 + h + 1. */
export const defaultAddressOf = (host: number): number => (0x0a000000 + host + 1) >>> 0;

/**
 * The order ports are tried in: a fixed, non-linear permutation of the ephemeral range. CRC
 * hashes are linear in the port's bits, so the ports reaching one path form a coset that in
 * numeric order can sit far from the start of the range; mixing the order finds one after
 * about range/(matches+1) tries whatever the hash's structure.
 */
export const SCAN_ORDER: readonly number[] = (() => {
  const size = EPHEMERAL_PORTS.last - EPHEMERAL_PORTS.first + 1;
  const mask = size - 1;
  return Array.from({ length: size }, (_, k) => {
    // Odd multipliers and xor-shifts are each bijective on 14 bits, so this is a permutation.
    let x = (k * 0x2f0b) & mask;
    x ^= x >>> 7;
    x = (x * 0x1a4d) & mask;
    x ^= x >>> 5;
    return EPHEMERAL_PORTS.first + x;
  });
})();

/**
 * A source port per request such that every hop of the request hashes to its member, or null
 * when no port in the ephemeral range does. Ports are tried in `SCAN_ORDER`, so the answer
 * is deterministic; a port already given to an earlier request from the
 * same source address is skipped while an unused one matches, so a host's flows get distinct
 * ports where possible.
 */
export function steerPorts(requests: readonly SteerRequest[], model: SwitchHashModel): (number | null)[] {
  const usedBySource = new Map<number, Set<number>>();
  return requests.map((request) => {
    const used = usedBySource.get(request.srcAddress) ?? new Set<number>();
    usedBySource.set(request.srcAddress, used);
    let reusable: number | null = null;
    const tuple = { srcAddress: request.srcAddress, dstAddress: request.dstAddress, protocol: UDP, dstPort: ROCE_V2_PORT };
    const hops = request.hops.map((hop) => ({ member: hop.member, of: hopBySourcePort(model, tuple, hop.members, hop.tier) }));
    for (const port of SCAN_ORDER) {
      if (reusable !== null && used.has(port)) continue;
      if (!hops.every((hop) => hop.of(port) === hop.member)) continue;
      if (!used.has(port)) {
        used.add(port);
        return port;
      }
      reusable = port;
    }
    return reusable;
  });
}
